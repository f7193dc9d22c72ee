# One geolog region in one AWS region: a VPC with a public subnet per
# availability zone, security groups, geologd and CockroachDB instances.
# The caller passes the aws provider configured for the region and the
# fixed private addresses and user data of every instance.
terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.60"
    }
  }
}
