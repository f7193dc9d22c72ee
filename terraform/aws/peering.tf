# VPC peering between every pair of regions: the requester side in the
# lower-numbered region, the accepter in the other, a route each way
# (modules/peering).

module "peering_01" {
  source = "./modules/peering"
  providers = {
    aws.requester = aws.r0
    aws.accepter  = aws.r1
  }

  name                     = "${var.name}-${local.regions[0].name}-${local.regions[1].name}"
  requester_vpc_id         = module.region0.vpc_id
  requester_cidr           = local.regions[0].cidr
  requester_route_table_id = module.region0.route_table_id
  accepter_vpc_id          = module.region1.vpc_id
  accepter_cidr            = local.regions[1].cidr
  accepter_route_table_id  = module.region1.route_table_id
  accepter_aws_region      = local.regions[1].aws_region
}

module "peering_02" {
  source = "./modules/peering"
  providers = {
    aws.requester = aws.r0
    aws.accepter  = aws.r2
  }

  name                     = "${var.name}-${local.regions[0].name}-${local.regions[2].name}"
  requester_vpc_id         = module.region0.vpc_id
  requester_cidr           = local.regions[0].cidr
  requester_route_table_id = module.region0.route_table_id
  accepter_vpc_id          = module.region2.vpc_id
  accepter_cidr            = local.regions[2].cidr
  accepter_route_table_id  = module.region2.route_table_id
  accepter_aws_region      = local.regions[2].aws_region
}

module "peering_12" {
  source = "./modules/peering"
  providers = {
    aws.requester = aws.r1
    aws.accepter  = aws.r2
  }

  name                     = "${var.name}-${local.regions[1].name}-${local.regions[2].name}"
  requester_vpc_id         = module.region1.vpc_id
  requester_cidr           = local.regions[1].cidr
  requester_route_table_id = module.region1.route_table_id
  accepter_vpc_id          = module.region2.vpc_id
  accepter_cidr            = local.regions[2].cidr
  accepter_route_table_id  = module.region2.route_table_id
  accepter_aws_region      = local.regions[2].aws_region
}
