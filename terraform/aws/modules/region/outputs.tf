output "vpc_id" {
  value = aws_vpc.this.id
}

output "route_table_id" {
  description = "The subnets' route table (the peering module adds routes to it)."
  value       = aws_route_table.this.id
}

output "geolog_instance_ids" {
  value = aws_instance.geolog[*].id
}

output "geolog_public_ips" {
  value = aws_instance.geolog[*].public_ip
}

output "cockroach_public_ips" {
  value = aws_instance.cockroach[*].public_ip
}

output "security_group_ids" {
  value = {
    geolog    = aws_security_group.geolog.id
    cockroach = aws_security_group.cockroach.id
  }
}
