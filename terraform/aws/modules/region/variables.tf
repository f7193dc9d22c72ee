variable "name" {
  description = "Name tag prefix of this region's resources."
  type        = string
}

variable "region" {
  description = "The region: name, aws_region, cidr, azs, subnet_cidrs (one per zone) and index."
  type = object({
    name         = string
    aws_region   = string
    cidr         = string
    azs          = list(string)
    subnet_cidrs = list(string)
    index        = number
  })
}

variable "peer_cidrs" {
  description = "The other regions' VPC CIDRs (reached through peering), allowed to geologd's and CockroachDB's ports."
  type        = list(string)
}

variable "geolog_nodes" {
  description = "geologd instances: name, az_index, ip (fixed private address) and user_data (cloud-config)."
  type = list(object({
    name      = string
    az_index  = number
    ip        = string
    user_data = string
  }))
}

variable "cockroach_nodes" {
  description = "CockroachDB instances: name, az_index, ip and user_data."
  type = list(object({
    name      = string
    az_index  = number
    ip        = string
    user_data = string
  }))
}

variable "geolog_instance_type" {
  type = string
}

variable "geolog_volume_gb" {
  type = number
}

variable "geolog_volume_throughput_mibps" {
  type = number
}

variable "geolog_volume_iops" {
  type = number
}

variable "geolog_port" {
  type = number
}

variable "geolog_debug_port" {
  type = number
}

variable "cockroach_instance_type" {
  type = string
}

variable "cockroach_volume_gb" {
  type = number
}

variable "ami_name_filter" {
  type = string
}

variable "ssh_key_name" {
  type    = string
  default = null
}

variable "admin_cidrs" {
  type    = list(string)
  default = []
}

variable "client_cidrs" {
  type    = list(string)
  default = []
}
