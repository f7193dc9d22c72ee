# VPC peering between two regions: the connection from the requester's
# region, its acceptance in the accepter's, and a route each way.
terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source                = "hashicorp/aws"
      version               = "~> 5.60"
      configuration_aliases = [aws.requester, aws.accepter]
    }
  }
}
