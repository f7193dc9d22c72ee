variable "name" {
  description = "Prefix of every resource's Name tag, and the deployment's tag."
  type        = string
  default     = "geolog"
}

variable "regions" {
  description = "Exactly three regions, in order r0, r1, r2: geolog's region name (geologd --region), the AWS region, the VPC's CIDR (/16: one /24 subnet per availability zone) and its availability zones (the replicas of a region spread over them)."
  type = list(object({
    name       = string
    aws_region = string
    cidr       = string
    azs        = list(string)
  }))
  default = [
    { name = "us", aws_region = "us-east-1", cidr = "10.10.0.0/16", azs = ["us-east-1a", "us-east-1b", "us-east-1c"] },
    { name = "eu", aws_region = "eu-west-1", cidr = "10.20.0.0/16", azs = ["eu-west-1a", "eu-west-1b", "eu-west-1c"] },
    { name = "ap", aws_region = "ap-southeast-1", cidr = "10.30.0.0/16", azs = ["ap-southeast-1a", "ap-southeast-1b", "ap-southeast-1c"] },
  ]

  validation {
    condition     = length(var.regions) == 3
    error_message = "regions: exactly three (the module has one provider configuration per region)."
  }
  validation {
    condition     = length(distinct([for r in var.regions : r.name])) == 3 && length(distinct([for r in var.regions : r.aws_region])) == 3 && length(distinct([for r in var.regions : r.cidr])) == 3
    error_message = "regions: names, AWS regions and CIDRs must be distinct (peered VPCs need disjoint CIDRs)."
  }
  validation {
    condition     = alltrue([for r in var.regions : can(regex("^[a-z][a-z0-9]*$", r.name)) && can(cidrsubnet(r.cidr, 8, 0)) && endswith(r.cidr, "/16") && length(r.azs) >= 1])
    error_message = "regions: each name matches ^[a-z][a-z0-9]*$, each CIDR is a /16, each lists at least one availability zone."
  }
}

variable "geolog_nodes_per_region" {
  description = "geologd nodes per region: the replicas of each range's regional Raft group (3, one per zone, by default)."
  type        = number
  default     = 3

  validation {
    condition     = var.geolog_nodes_per_region >= 1 && var.geolog_nodes_per_region <= 80
    error_message = "geolog_nodes_per_region: in [1, 80] (the address plan: hosts .10 to .89 of the zone's subnet)."
  }
}

variable "geolog_instance_type" {
  description = "EC2 instance type of the geologd nodes."
  type        = string
  default     = "m6i.large"
}

variable "geolog_volume_gb" {
  description = "Root volume (gp3) of a geologd node, holding its segments."
  type        = number
  default     = 200
}

variable "geolog_volume_throughput_mibps" {
  description = "Provisioned throughput of a geologd node's gp3 volume, MiB/s (gp3: 125 to 1000). docs/capacity.md: a region of N nodes at R3 writes about 3 MB/s per 1,000 records/s of 1 KiB, so each node about 3/N of that."
  type        = number
  default     = 125

  validation {
    condition     = var.geolog_volume_throughput_mibps >= 125 && var.geolog_volume_throughput_mibps <= 1000
    error_message = "geolog_volume_throughput_mibps: gp3 takes 125 to 1000 MiB/s."
  }
}

variable "geolog_volume_iops" {
  description = "Provisioned IOPS of a geologd node's gp3 volume (gp3: 3000 to 16000). Every append batch costs a write and an fdatasync on each replica."
  type        = number
  default     = 3000

  validation {
    condition     = var.geolog_volume_iops >= 3000 && var.geolog_volume_iops <= 16000
    error_message = "geolog_volume_iops: gp3 takes 3000 to 16000."
  }
}

variable "geolog_port" {
  description = "geologd's gRPC port: clients, Raft between a region's nodes, and replication between regions."
  type        = number
  default     = 7400
}

variable "geolog_debug_port" {
  description = "geologd --debug-addr port (Prometheus /metrics and pprof), reachable from the VPCs only."
  type        = number
  default     = 9400
}

variable "geologd_url" {
  description = "HTTPS URL of the geologd binary for linux/amd64 (a release asset or a presigned S3 URL); every node downloads it at boot."
  type        = string
}

variable "geologd_sha256" {
  description = "SHA-256 of the geologd binary; the boot script refuses a download that does not match. Empty skips the check."
  type        = string
  default     = ""
}

variable "geologd_fsync" {
  description = "geologd --fsync: always (acks after a quorum fsync), or never (benchmarks only)."
  type        = string
  default     = "always"

  validation {
    condition     = contains(["always", "never"], var.geologd_fsync)
    error_message = "geologd_fsync: always or never."
  }
}

variable "geologd_extra_args" {
  description = "More geologd flags, one argument per element (e.g. [\"--log-level\", \"debug\"])."
  type        = list(string)
  default     = []
}

variable "lease_store" {
  description = "Give geologd --lease-store (the CockroachDB cluster below), with --lease-ttl and --max-clock-offset; each flag only where the installed geologd has it."
  type        = bool
  default     = true
}

variable "lease_ttl" {
  description = "geologd --lease-ttl: how long a node's liveness record lasts without a heartbeat."
  type        = string
  default     = "5s"
}

variable "max_clock_offset" {
  description = "The clock offset bound, the same for geologd (--max-clock-offset) and CockroachDB (--max-offset): both rely on clocks within it (chrony with the Amazon Time Sync Service keeps them well inside)."
  type        = string
  default     = "500ms"
}

variable "cockroach_nodes_per_region" {
  description = "CockroachDB nodes per region; 3 gives one per zone, and with survival_goal REGION each region keeps a quorum of its rows' replicas elsewhere."
  type        = number
  default     = 3

  validation {
    condition     = var.cockroach_nodes_per_region >= 1 && var.cockroach_nodes_per_region <= 80
    error_message = "cockroach_nodes_per_region: in [1, 80] (hosts .100 to .179 of the zone's subnet)."
  }
}

variable "cockroach_instance_type" {
  description = "EC2 instance type of the CockroachDB nodes."
  type        = string
  default     = "m6i.large"
}

variable "cockroach_volume_gb" {
  description = "Root volume (gp3) of a CockroachDB node."
  type        = number
  default     = 100
}

variable "cockroach_url" {
  description = "URL of the CockroachDB release tarball for linux/amd64 (cockroach-<version>.linux-amd64.tgz)."
  type        = string
  default     = "https://binaries.cockroachdb.com/cockroach-v24.1.5.linux-amd64.tgz"
}

variable "cockroach_sha256" {
  description = "SHA-256 of that tarball; empty skips the check."
  type        = string
  default     = ""
}

variable "lease_database" {
  description = "The lease store's database."
  type        = string
  default     = "geolog_leases"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_]*$", var.lease_database))
    error_message = "lease_database: a plain SQL identifier (lowercase letters, digits, underscores)."
  }
}

variable "lease_primary_region" {
  description = "geolog name of the lease database's primary region; empty means the first region."
  type        = string
  default     = ""
}

variable "survival_goal" {
  description = "The lease database's survival goal: region (default: a region's liveness rows stay writable when it is lost, which is when a takeover needs them) or zone."
  type        = string
  default     = "region"

  validation {
    condition     = contains(["region", "zone"], var.survival_goal)
    error_message = "survival_goal: region or zone."
  }
}

variable "ami_name_filter" {
  description = "Name filter of the AMI (owner: Canonical) every instance boots: Ubuntu 22.04, amd64, with cloud-init and systemd."
  type        = string
  default     = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
}

variable "ssh_key_name" {
  description = "EC2 key pair for SSH, which must exist in every region under this name; null for none."
  type        = string
  default     = null
}

variable "admin_cidrs" {
  description = "CIDRs allowed to SSH to every instance and to reach CockroachDB's admin UI (8080)."
  type        = list(string)
  default     = []
}

variable "client_cidrs" {
  description = "CIDRs outside the VPCs allowed to reach geologd's gRPC port on the nodes' public addresses. Redirects and leader hints carry private addresses, so clients belong inside the VPCs (or a peered network) anyway."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags on every resource, beside Deployment = name."
  type        = map(string)
  default     = {}
}
