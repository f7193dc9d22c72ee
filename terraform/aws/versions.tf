# geolog on AWS: three regions, each a VPC with geologd nodes and
# CockroachDB nodes (the lease store), VPC peering between every pair. See
# README.md beside this file.
terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.60"
    }
    tls = {
      source  = "hashicorp/tls"
      version = "~> 4.0"
    }
  }
}
