# One VPC with its subnets, security groups, geologd and CockroachDB
# instances per region (modules/region), each through its region's provider.

module "region0" {
  source = "./modules/region"
  providers = {
    aws = aws.r0
  }

  name            = "${var.name}-${local.regions[0].name}"
  region          = local.regions[0]
  peer_cidrs      = [for r in local.regions : r.cidr if r.index != 0]
  geolog_nodes    = [for k, n in local.geolog_nodes[local.regions[0].name] : merge(n, { user_data = local.geologd_user_data[local.regions[0].name][k] })]
  cockroach_nodes = [for k, n in local.cockroach_nodes[local.regions[0].name] : merge(n, { user_data = local.cockroach_user_data[local.regions[0].name][k] })]

  geolog_instance_type           = var.geolog_instance_type
  geolog_volume_gb               = var.geolog_volume_gb
  geolog_volume_throughput_mibps = var.geolog_volume_throughput_mibps
  geolog_volume_iops             = var.geolog_volume_iops
  geolog_port                    = var.geolog_port
  geolog_debug_port              = var.geolog_debug_port
  cockroach_instance_type        = var.cockroach_instance_type
  cockroach_volume_gb            = var.cockroach_volume_gb
  ami_name_filter                = var.ami_name_filter
  ssh_key_name                   = var.ssh_key_name
  admin_cidrs                    = var.admin_cidrs
  client_cidrs                   = var.client_cidrs
}

module "region1" {
  source = "./modules/region"
  providers = {
    aws = aws.r1
  }

  name            = "${var.name}-${local.regions[1].name}"
  region          = local.regions[1]
  peer_cidrs      = [for r in local.regions : r.cidr if r.index != 1]
  geolog_nodes    = [for k, n in local.geolog_nodes[local.regions[1].name] : merge(n, { user_data = local.geologd_user_data[local.regions[1].name][k] })]
  cockroach_nodes = [for k, n in local.cockroach_nodes[local.regions[1].name] : merge(n, { user_data = local.cockroach_user_data[local.regions[1].name][k] })]

  geolog_instance_type           = var.geolog_instance_type
  geolog_volume_gb               = var.geolog_volume_gb
  geolog_volume_throughput_mibps = var.geolog_volume_throughput_mibps
  geolog_volume_iops             = var.geolog_volume_iops
  geolog_port                    = var.geolog_port
  geolog_debug_port              = var.geolog_debug_port
  cockroach_instance_type        = var.cockroach_instance_type
  cockroach_volume_gb            = var.cockroach_volume_gb
  ami_name_filter                = var.ami_name_filter
  ssh_key_name                   = var.ssh_key_name
  admin_cidrs                    = var.admin_cidrs
  client_cidrs                   = var.client_cidrs
}

module "region2" {
  source = "./modules/region"
  providers = {
    aws = aws.r2
  }

  name            = "${var.name}-${local.regions[2].name}"
  region          = local.regions[2]
  peer_cidrs      = [for r in local.regions : r.cidr if r.index != 2]
  geolog_nodes    = [for k, n in local.geolog_nodes[local.regions[2].name] : merge(n, { user_data = local.geologd_user_data[local.regions[2].name][k] })]
  cockroach_nodes = [for k, n in local.cockroach_nodes[local.regions[2].name] : merge(n, { user_data = local.cockroach_user_data[local.regions[2].name][k] })]

  geolog_instance_type           = var.geolog_instance_type
  geolog_volume_gb               = var.geolog_volume_gb
  geolog_volume_throughput_mibps = var.geolog_volume_throughput_mibps
  geolog_volume_iops             = var.geolog_volume_iops
  geolog_port                    = var.geolog_port
  geolog_debug_port              = var.geolog_debug_port
  cockroach_instance_type        = var.cockroach_instance_type
  cockroach_volume_gb            = var.cockroach_volume_gb
  ami_name_filter                = var.ami_name_filter
  ssh_key_name                   = var.ssh_key_name
  admin_cidrs                    = var.admin_cidrs
  client_cidrs                   = var.client_cidrs
}
