resource "aws_vpc" "this" {
  cidr_block           = var.region.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = {
    Name = var.name
  }
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id

  tags = {
    Name = var.name
  }
}

# Public subnets: instances download geologd and CockroachDB at boot and
# may serve clients on public addresses (client_cidrs); security groups
# admit only the VPCs, admin_cidrs and client_cidrs.
resource "aws_subnet" "zone" {
  count                   = length(var.region.azs)
  vpc_id                  = aws_vpc.this.id
  cidr_block              = var.region.subnet_cidrs[count.index]
  availability_zone       = var.region.azs[count.index]
  map_public_ip_on_launch = true

  tags = {
    Name = "${var.name}-${var.region.azs[count.index]}"
  }
}

# One route table for the region's subnets; the peering module adds a route
# to each other region's CIDR.
resource "aws_route_table" "this" {
  vpc_id = aws_vpc.this.id

  tags = {
    Name = var.name
  }
}

resource "aws_route" "internet" {
  route_table_id         = aws_route_table.this.id
  destination_cidr_block = "0.0.0.0/0"
  gateway_id             = aws_internet_gateway.this.id
}

resource "aws_route_table_association" "zone" {
  count          = length(aws_subnet.zone)
  subnet_id      = aws_subnet.zone[count.index].id
  route_table_id = aws_route_table.this.id
}

locals {
  vpc_cidrs = concat([var.region.cidr], var.peer_cidrs)

  geolog_ingress = merge(
    { for c in local.vpc_cidrs : "grpc ${c}" => { port = var.geolog_port, cidr = c, what = "geologd gRPC (clients, Raft, replication)" } },
    { for c in local.vpc_cidrs : "debug ${c}" => { port = var.geolog_debug_port, cidr = c, what = "geologd metrics and pprof" } },
    { for c in var.client_cidrs : "client ${c}" => { port = var.geolog_port, cidr = c, what = "geologd gRPC from clients" } },
    { for c in var.admin_cidrs : "ssh ${c}" => { port = 22, cidr = c, what = "SSH" } },
  )

  cockroach_ingress = merge(
    { for c in local.vpc_cidrs : "sql ${c}" => { port = 26257, cidr = c, what = "CockroachDB SQL and RPC (nodes and geologd)" } },
    { for c in local.vpc_cidrs : "http ${c}" => { port = 8080, cidr = c, what = "CockroachDB admin UI and health" } },
    { for c in var.admin_cidrs : "admin ${c}" => { port = 8080, cidr = c, what = "CockroachDB admin UI" } },
    { for c in var.admin_cidrs : "ssh ${c}" => { port = 22, cidr = c, what = "SSH" } },
  )
}

resource "aws_security_group" "geolog" {
  name        = "${var.name}-geolog"
  description = "geologd nodes"
  vpc_id      = aws_vpc.this.id

  tags = {
    Name = "${var.name}-geolog"
  }
}

resource "aws_vpc_security_group_ingress_rule" "geolog" {
  for_each          = local.geolog_ingress
  security_group_id = aws_security_group.geolog.id
  description       = each.value.what
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
  cidr_ipv4         = each.value.cidr
}

resource "aws_vpc_security_group_egress_rule" "geolog" {
  security_group_id = aws_security_group.geolog.id
  description       = "everything (other regions, the lease store, downloads)"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_security_group" "cockroach" {
  name        = "${var.name}-cockroach"
  description = "CockroachDB nodes (geolog lease store)"
  vpc_id      = aws_vpc.this.id

  tags = {
    Name = "${var.name}-cockroach"
  }
}

resource "aws_vpc_security_group_ingress_rule" "cockroach" {
  for_each          = local.cockroach_ingress
  security_group_id = aws_security_group.cockroach.id
  description       = each.value.what
  ip_protocol       = "tcp"
  from_port         = each.value.port
  to_port           = each.value.port
  cidr_ipv4         = each.value.cidr
}

resource "aws_vpc_security_group_egress_rule" "cockroach" {
  security_group_id = aws_security_group.cockroach.id
  description       = "everything (other regions, downloads)"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}
