locals {
  region_modules = [module.region0, module.region1, module.region2]
}

output "regions" {
  description = "Per geolog region: AWS region, VPC, geologd endpoints (private; give them to geolog --addr from inside the VPCs), the nodes' public addresses, the CockroachDB SQL endpoints and the lease store URL the nodes use."
  value = {
    for i, r in local.regions : r.name => {
      aws_region         = r.aws_region
      vpc_id             = local.region_modules[i].vpc_id
      geolog_endpoints   = join(",", local.geolog_addrs[r.name])
      geolog_public_ips  = local.region_modules[i].geolog_public_ips
      geolog_instances   = local.region_modules[i].geolog_instance_ids
      cockroach_sql      = [for n in local.cockroach_nodes[r.name] : "${n.ip}:26257"]
      cockroach_admin_ui = [for n in local.cockroach_nodes[r.name] : "https://${n.ip}:8080"]
      cockroach_public   = local.region_modules[i].cockroach_public_ips
      lease_store_url    = local.lease_url[r.name][0]
    }
  }
}

output "geolog_addr_all" {
  description = "Every geologd node, comma-separated: geolog --addr for `geolog ranges`."
  value       = join(",", flatten([for r in local.regions : local.geolog_addrs[r.name]]))
}

output "peering_connections" {
  description = "The VPC peering connection of each pair of regions."
  value = {
    "${local.regions[0].name}-${local.regions[1].name}" = module.peering_01.id
    "${local.regions[0].name}-${local.regions[2].name}" = module.peering_02.id
    "${local.regions[1].name}-${local.regions[2].name}" = module.peering_12.id
  }
}

output "lease_database" {
  description = "The lease store: database, primary region, regions and survival goal, as files/leases-init.sh sets them on the first CockroachDB node of the first region."
  value = {
    database      = var.lease_database
    primary       = local.lease_primary
    regions       = [for r in local.regions : r.aws_region]
    survival_goal = upper(var.survival_goal)
    init_node     = local.cockroach_init_node.ip
  }
}

output "cockroach_ca_cert" {
  description = "The CockroachDB CA certificate (sslrootcert for SQL clients)."
  value       = tls_self_signed_cert.ca.cert_pem
}

output "cockroach_root_client" {
  description = "The root client certificate and key for `cockroach sql --certs-dir` (sensitive)."
  sensitive   = true
  value = {
    cert = tls_locally_signed_cert.client["root"].cert_pem
    key  = tls_private_key.client["root"].private_key_pem_pkcs8
  }
}

output "geolog_ca_cert" {
  description = "The geolog CA certificate: clients verify geologd with it (geolog --tls-ca, or ca.crt in --certs-dir)."
  value       = tls_self_signed_cert.geolog_ca.cert_pem
}

output "geolog_operator_client" {
  description = "The operator principal's client certificate and key (client.crt and client.key in geolog --certs-dir; sensitive)."
  sensitive   = true
  value = {
    cert = tls_locally_signed_cert.geolog_operator.cert_pem
    key  = tls_private_key.geolog_operator.private_key_pem_pkcs8
  }
}
