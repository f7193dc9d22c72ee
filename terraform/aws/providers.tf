# One provider configuration per region: a resource's region is its
# provider's, and provider configurations cannot be made with for_each, so
# the module has exactly three regions, r0, r1 and r2 (var.regions[0..2]).

provider "aws" {
  alias  = "r0"
  region = var.regions[0].aws_region

  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "r1"
  region = var.regions[1].aws_region

  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "r2"
  region = var.regions[2].aws_region

  default_tags {
    tags = local.tags
  }
}
