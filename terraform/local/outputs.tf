# Every output depends on terraform_data.ready: apply prints them once every
# node answers.

output "region_endpoints" {
  description = "Per region, its nodes' client addresses, comma-separated (geolog --addr)."
  value       = { for region in var.regions : region => join(",", local.node_addrs[region]) }
  depends_on  = [terraform_data.ready]
}

output "all_endpoints" {
  description = "Every node's client address, comma-separated (geolog --addr for `geolog ranges`)."
  value       = join(",", local.all_addrs)
  depends_on  = [terraform_data.ready]
}

output "nodes" {
  description = "Per node: region, id, client address, debug address (metrics, pprof), data folder and log."
  value       = local.nodes
  depends_on  = [terraform_data.ready]
}

output "wan_control_url" {
  description = "The WAN emulator's control API (GET /links, POST /regions/<r>/cut, POST /heal)."
  value       = "http://${local.wan_control}"
  depends_on  = [terraform_data.ready]
}

output "postgres_url" {
  description = "The lease store's PostgreSQL; null when lease_store is false."
  value       = var.lease_store ? local.lease_store : null
  depends_on  = [terraform_data.ready, terraform_data.postgres]
}

output "env_file" {
  description = "A file to source: GEOLOG_ADDR_<REGION>, GEOLOG_ADDR_ALL, GEOLOG_WAN_CONTROL, GEOLOG_CLUSTER_REGIONS, and GEOLOG_LEASE_STORE with lease_store."
  value       = terraform_data.ready.output.env_file
}

output "data_dir" {
  description = "The run folder: data/, pids/, pg/, logs and env."
  value       = local.run_dir
}
