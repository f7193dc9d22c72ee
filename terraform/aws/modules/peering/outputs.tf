output "id" {
  description = "The peering connection's id."
  value       = aws_vpc_peering_connection.this.id
}
