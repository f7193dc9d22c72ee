variable "name" {
  description = "Name tag of the peering connection."
  type        = string
}

variable "requester_vpc_id" {
  type = string
}

variable "requester_cidr" {
  type = string
}

variable "requester_route_table_id" {
  type = string
}

variable "accepter_vpc_id" {
  type = string
}

variable "accepter_cidr" {
  type = string
}

variable "accepter_route_table_id" {
  type = string
}

variable "accepter_aws_region" {
  description = "The accepter's AWS region (the requester's provider asks for the connection there)."
  type        = string
}
