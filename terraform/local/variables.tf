variable "regions" {
  description = "The cluster's regions, in port-plan order. Names are lowercase letters and digits: they are geolog region names and, upper-cased, part of the env file's GEOLOG_ADDR_<REGION> names."
  type        = list(string)
  default     = ["us", "eu", "ap"]

  validation {
    condition     = length(var.regions) >= 1 && length(var.regions) == length(distinct(var.regions)) && alltrue([for r in var.regions : can(regex("^[a-z][a-z0-9]*$", r))])
    error_message = "regions: at least one, distinct, each matching ^[a-z][a-z0-9]*$."
  }
}

variable "nodes_per_region" {
  description = "geologd nodes per region, one Raft replica of each range each (3 in production; 1 makes one-node regions)."
  type        = number
  default     = 3

  validation {
    condition     = var.nodes_per_region >= 1 && var.nodes_per_region <= 9 && floor(var.nodes_per_region) == var.nodes_per_region
    error_message = "nodes_per_region: an integer in [1, 9]."
  }
}

variable "latency_default" {
  description = "One-way WAN latency of a pair of regions that latencies does not name (a Go duration)."
  type        = string
  default     = "50ms"
}

variable "latencies" {
  description = "One-way WAN latency per pair of regions, both directions, keyed \"a-b\" in either order (a Go duration)."
  type        = map(string)
  default = {
    "us-eu" = "40ms"
    "us-ap" = "75ms"
    "eu-ap" = "60ms"
  }
}

variable "jitter" {
  description = "Jitter added to every WAN link's latency (a Go duration)."
  type        = string
  default     = "3ms"
}

variable "base_port" {
  description = "First port of the port plan (README.md): WAN control at base, PostgreSQL at base+1, then nodes, debug listeners and WAN links. The default leaves scripts/cluster.sh's default plan (7500-7599, 7601-7623, 7700+) free."
  type        = number
  default     = 7640

  validation {
    condition     = var.base_port >= 1024 && var.base_port <= 65000
    error_message = "base_port: in [1024, 65000]."
  }
}

variable "data_dir" {
  description = "Folder of the cluster's data, logs, pid files and env file; empty means run/ beside this module. destroy removes what the module put there, and the folder itself when it is then empty."
  type        = string
  default     = ""
}

variable "fsync" {
  description = "geologd --fsync: always, or never (benchmarks only: acks then mean page cache)."
  type        = string
  default     = "always"

  validation {
    condition     = contains(["always", "never"], var.fsync)
    error_message = "fsync: always or never."
  }
}

variable "gomaxprocs" {
  description = "GOMAXPROCS of each node: several runtimes share this machine's cores (scripts/cluster.sh explains the default of 1)."
  type        = number
  default     = 1
}

variable "log_level" {
  description = "geologd --log-level."
  type        = string
  default     = "info"
}

variable "debug_listeners" {
  description = "Give every node a --debug-addr (Prometheus /metrics and pprof) from the port plan."
  type        = bool
  default     = true
}

variable "lease_store" {
  description = "Start PostgreSQL (scripts/pg.sh) as the lease store, and pass --lease-store to nodes whose geologd has that flag."
  type        = bool
  default     = true
}

variable "tls" {
  description = "TLS on every hop: a development PKI under data_dir/certs (scripts/pki.sh: a CA, a folder per node, a client \"operator\"), every node with its certificate, the env file exporting GEOLOG_CERTS_DIR for clients. False runs every node with --insecure."
  type        = bool
  default     = true
}

variable "atrest" {
  description = "Encryption at rest: every node runs with --kek-file, a KEK file of its own under data_dir/keks (geolog keys add-kek; mode 0600, outside its data directory), so its segments and catalogue are sealed on disk. False leaves them in the clear."
  type        = bool
  default     = true
}

variable "repo_dir" {
  description = "The geolog checkout (for scripts/pg.sh and the default binaries); empty means two folders above this module."
  type        = string
  default     = ""
}

variable "bin_dir" {
  description = "Folder of geologd, geolog and geolog-wan (make build); empty means bin/ in repo_dir."
  type        = string
  default     = ""
}

variable "geologd_path" {
  description = "The geologd binary; empty means bin_dir/geologd."
  type        = string
  default     = ""
}

variable "geolog_path" {
  description = "The geolog CLI, used to check that every node answers; empty means bin_dir/geolog."
  type        = string
  default     = ""
}

variable "geolog_wan_path" {
  description = "The geolog-wan binary; empty means bin_dir/geolog-wan."
  type        = string
  default     = ""
}

variable "start_timeout_seconds" {
  description = "How long apply waits for each process to listen, and then for every node to answer."
  type        = number
  default     = 90
}

variable "stop_timeout_seconds" {
  description = "How long destroy waits after SIGTERM before SIGKILL."
  type        = number
  default     = 15
}

variable "lease_ttl" {
  description = "geologd --lease-ttl (a Go duration) with lease_store; empty keeps geologd's default."
  type        = string
  default     = ""
}

variable "lease_heartbeat" {
  description = "geologd --lease-heartbeat (a Go duration) with lease_store; empty keeps geologd's default."
  type        = string
  default     = ""
}

variable "max_clock_offset" {
  description = "geologd --max-clock-offset (a Go duration) with lease_store; empty keeps geologd's default."
  type        = string
  default     = ""
}

variable "debug_failpoints" {
  description = "Start every node with --debug-failpoints (slow or failing fsync, clock skew, set on its debug listener): chaos runs only. Needs debug_listeners."
  type        = bool
  default     = false
}

variable "cursor_compaction_lag" {
  description = "Every node's --cursor-compaction-lag (a Go duration): how long a cursor record of _cursors is kept before compaction by key may drop it. Empty: geologd's default (a minute). make chaos sets 1h: its group checker reads the whole cursor log."
  type        = string
  default     = ""
}

variable "chaos_links" {
  description = "Route more through the WAN emulator, as the chaos harness's own clusters do: each region's link to the lease store (\"<region>->pg\", with lease_store), the Raft links between a region's nodes (\"us:n1->us:n2\", no added latency) and a client link to every node (\"client->us:n1\", client_latency). The port plan grows at its end (README.md)."
  type        = bool
  default     = false
}

variable "client_latency" {
  description = "One-way latency of the client links (chaos_links), a Go duration."
  type        = string
  default     = "10ms"
}
