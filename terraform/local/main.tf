locals {
  repo_dir   = var.repo_dir != "" ? abspath(var.repo_dir) : abspath("${path.module}/../..")
  bin_dir    = var.bin_dir != "" ? abspath(var.bin_dir) : "${local.repo_dir}/bin"
  geologd    = var.geologd_path != "" ? abspath(var.geologd_path) : "${local.bin_dir}/geologd"
  geolog     = var.geolog_path != "" ? abspath(var.geolog_path) : "${local.bin_dir}/geolog"
  geolog_wan = var.geolog_wan_path != "" ? abspath(var.geolog_wan_path) : "${local.bin_dir}/geolog-wan"
  pg_script  = "${local.repo_dir}/scripts/pg.sh"
  helper     = abspath("${path.module}/scripts/proc.sh")
  run_dir    = var.data_dir != "" ? abspath(var.data_dir) : abspath("${path.module}/run")
  env_file   = "${local.run_dir}/env"

  region_count = length(var.regions)
  node_count   = var.nodes_per_region

  # The port plan (README.md). B = base_port, R regions, M nodes per region,
  # region index r, node i in 1..M:
  #   B                          WAN control API
  #   B + 1                      PostgreSQL (lease_store)
  #   B + 2 + rM + i - 1         node gRPC
  #   B + 2 + RM + rM + i - 1    node debug (metrics, pprof)
  #   B + 2 + 2RM + (f(R-1) + t')M + i - 1
  #                              WAN link from region f to node i of region t
  #                              (t' = t, less one when t > f)
  wan_control = "127.0.0.1:${var.base_port}"
  pg_port     = var.base_port + 1
  pg_dir      = "${local.run_dir}/pg"
  # scripts/pg.sh serves TLS only, its certificate from its own CA.
  pg_tls         = "sslmode=verify-full&sslrootcert=${urlencode("${local.pg_dir}/tls/ca.crt")}"
  lease_store    = var.lease_store ? "postgres://postgres@127.0.0.1:${local.pg_port}/postgres?${local.pg_tls}" : ""
  certs_dir      = "${local.run_dir}/certs"
  keks_dir       = "${local.run_dir}/keks" # atrest: a KEK file per node, outside its data directory
  node_port_base = var.base_port + 2
  debug_port_base = (
    var.base_port + 2 + local.region_count * local.node_count
  )
  link_port_base = (
    var.base_port + 2 + 2 * local.region_count * local.node_count
  )
  # With chaos_links, after the WAN links (L = the first port after them):
  #   L + r                      lease-store link of region r ("<r>->pg")
  #   L + R + rM(M-1) + (i-1)(M-1) + j' - 1
  #                              Raft link from node i to node j of region r
  #                              (j' = j, less one when j > i)
  #   L + R + RM(M-1) + rM + i - 1
  #                              client link to node i of region r
  pg_link_base = (
    local.link_port_base + local.region_count * (local.region_count - 1) * local.node_count
  )
  raft_link_base   = local.pg_link_base + local.region_count
  client_link_base = local.raft_link_base + local.region_count * local.node_count * (local.node_count - 1)
  port_last = (
    var.chaos_links ? local.client_link_base + local.region_count * local.node_count - 1 :
    local.pg_link_base - 1
  )

  node_addrs = {
    for r, region in var.regions : region => [
      for i in range(1, local.node_count + 1) :
      "127.0.0.1:${local.node_port_base + r * local.node_count + i - 1}"
    ]
  }

  # link_addrs[from][to]: to's nodes as seen from from, through the WAN.
  link_addrs = {
    for f, from in var.regions : from => {
      for t, to in var.regions : to => [
        for i in range(1, local.node_count + 1) :
        "127.0.0.1:${local.link_port_base + (f * (local.region_count - 1) + (t > f ? t - 1 : t)) * local.node_count + i - 1}"
      ] if t != f
    }
  }

  links = flatten([
    for f, from in var.regions : [
      for t, to in var.regions : [
        for i in range(1, local.node_count + 1) : {
          name     = "${from}->${to}.n${i}"
          listen   = local.link_addrs[from][to][i - 1]
          upstream = local.node_addrs[to][i - 1]
          latency  = lookup(var.latencies, "${from}-${to}", lookup(var.latencies, "${to}-${from}", var.latency_default))
        }
      ] if t != f
    ]
  ])

  # chaos_links: the lease store per region, Raft inside a region, clients.
  pg_links = var.chaos_links && var.lease_store ? [
    for r, region in var.regions : {
      name     = "${region}->pg"
      listen   = "127.0.0.1:${local.pg_link_base + r}"
      upstream = "127.0.0.1:${local.pg_port}"
    }
  ] : []
  raft_link_addrs = {
    for r, region in var.regions : region => {
      for i in range(1, local.node_count + 1) : tostring(i) => {
        for j in range(1, local.node_count + 1) : tostring(j) =>
        "127.0.0.1:${local.raft_link_base + (r * local.node_count + i - 1) * (local.node_count - 1) + (j > i ? j - 1 : j) - 1}"
        if j != i
      }
    }
  }
  raft_links = var.chaos_links ? flatten([
    for r, region in var.regions : [
      for i in range(1, local.node_count + 1) : [
        for j in range(1, local.node_count + 1) : {
          name     = "${region}:n${i}->${region}:n${j}"
          listen   = local.raft_link_addrs[region][tostring(i)][tostring(j)]
          upstream = local.node_addrs[region][j - 1]
        } if j != i
      ]
    ]
  ]) : []
  client_links = var.chaos_links ? flatten([
    for r, region in var.regions : [
      for i in range(1, local.node_count + 1) : {
        name     = "client->${region}:n${i}"
        listen   = "127.0.0.1:${local.client_link_base + r * local.node_count + i - 1}"
        upstream = local.node_addrs[region][i - 1]
      }
    ]
  ]) : []

  wan_argv = concat(
    [local.geolog_wan, "--control", local.wan_control, "--seed", "1"],
    flatten([for l in local.links : ["--link", "${l.name},${l.listen},${l.upstream},${l.latency},${var.jitter}"]]),
    flatten([for l in local.pg_links : ["--link", "${l.name},${l.listen},${l.upstream},0s,0s"]]),
    flatten([for l in local.raft_links : ["--link", "${l.name},${l.listen},${l.upstream},0s,0s"]]),
    flatten([for l in local.client_links : ["--link", "${l.name},${l.listen},${l.upstream},${var.client_latency},0s"]]),
  )

  # With chaos_links each node advertises its client link (geologd
  # --advertise-addr): every leader and home hint then names it, and a
  # client never rides a Raft or WAN link.
  advertise_of = { for l in local.client_links : trimprefix(l.name, "client->") => l.listen }

  # Each node's lease store: through its region's link with chaos_links.
  lease_store_of = {
    for r, region in var.regions : region => (
      var.chaos_links ? "postgres://postgres@127.0.0.1:${local.pg_link_base + r}/postgres?${local.pg_tls}" : local.lease_store
    )
  }
  # Homing flags, passed (like --lease-store) only to a geologd that has them.
  homing_flags = concat(
    var.lease_ttl != "" ? ["--if-flag", "--lease-ttl", var.lease_ttl] : [],
    var.lease_heartbeat != "" ? ["--if-flag", "--lease-heartbeat", var.lease_heartbeat] : [],
    var.max_clock_offset != "" ? ["--if-flag", "--max-clock-offset", var.max_clock_offset] : [],
  )

  nodes = merge([
    for r, region in var.regions : {
      for i in range(1, local.node_count + 1) : "${region}-n${i}" => {
        region     = region
        id         = i
        addr       = local.node_addrs[region][i - 1]
        port       = local.node_port_base + r * local.node_count + i - 1
        debug_addr = var.debug_listeners ? "127.0.0.1:${local.debug_port_base + r * local.node_count + i - 1}" : ""
        data       = "${local.run_dir}/data/${region}-n${i}"
        log        = "${local.run_dir}/${region}-n${i}.log"
      }
    }
  ]...)

  node_argv = {
    for name, n in local.nodes : name => concat(
      ["env", "GOMAXPROCS=${var.gomaxprocs}", local.geologd,
        "--data-dir", n.data,
        "--listen", n.addr,
        "--region", n.region,
        "--node-id", tostring(n.id),
        "--peers", join(",", [
          for i, a in local.node_addrs[n.region] :
          "${i + 1}=${var.chaos_links && i + 1 != n.id ? local.raft_link_addrs[n.region][tostring(n.id)][tostring(i + 1)] : a}"
        ]),
        "--fsync", var.fsync,
      "--log-level", var.log_level],
      var.tls ? ["--certs-dir", "${local.certs_dir}/${name}", "--superusers", "operator"] : ["--insecure"], # operator: the client certificate pki_make issues
      var.atrest ? ["--kek-file", "${local.keks_dir}/${name}.json"] : [],
      var.cursor_compaction_lag != "" ? ["--cursor-compaction-lag", var.cursor_compaction_lag] : [],
      n.debug_addr != "" ? ["--debug-addr", n.debug_addr] : [],
      n.debug_addr != "" && var.debug_failpoints ? ["--debug-failpoints"] : [],
      flatten([for to, addrs in local.link_addrs[n.region] : ["--region-addrs", "${to}=${join(",", addrs)}"]]),
    )
  }

  # Any change to a node's flags (the set of nodes, their peers, fsync, ...)
  # recreates every node with empty data: a Raft member must not come back
  # with a blank log under its old id, and this is a test cluster.
  nodes_fingerprint = sha256(jsonencode(local.node_argv))

  all_addrs = flatten([for region in var.regions : local.node_addrs[region]])

  # What tools source (like run/cluster/env of scripts/cluster.sh).
  env_content = join("\n", concat(
    ["# written by terraform/local (terraform apply), removed by terraform destroy; source it: . ${local.env_file}"],
    [for region in var.regions : "export GEOLOG_ADDR_${upper(region)}=${join(",", local.node_addrs[region])}"],
    ["export GEOLOG_ADDR_ALL=${join(",", local.all_addrs)}"],
    ["export GEOLOG_WAN_CONTROL=${local.wan_control}"],
    ["export GEOLOG_CLUSTER_REGIONS=\"${join(" ", var.regions)}\""],
    var.tls ? ["export GEOLOG_CERTS_DIR='${local.certs_dir}/client'"] : [],
    var.lease_store ? ["export GEOLOG_LEASE_STORE='${local.lease_store}'"] : [],
    # What the chaos harness needs to stop and start the lease store.
    var.lease_store ? [
      "export GEOLOG_PG_SCRIPT='${local.pg_script}'",
      "export GEOLOG_PG_PORT=${local.pg_port}",
      "export GEOLOG_PG_DIR='${local.pg_dir}'",
    ] : [],
  ))

  # Shell words for local-exec: each argument in single quotes.
  wan_start = join(" ", [for a in concat([local.helper, "start", local.run_dir, "wan", tostring(var.base_port), tostring(var.start_timeout_seconds), "--"], local.wan_argv) : "'${replace(a, "'", "'\\''")}'"])
  wan_stop  = join(" ", [for a in [local.helper, "stop", local.run_dir, "wan", tostring(var.stop_timeout_seconds)] : "'${replace(a, "'", "'\\''")}'"])
  node_start = {
    for name, n in local.nodes : name => join(" ", [
      for a in concat(
        [local.helper, "start"],
        var.lease_store ? concat(["--if-flag", "--lease-store", local.lease_store_of[n.region]], local.homing_flags) : [],
        var.chaos_links ? ["--if-flag", "--advertise-addr", local.advertise_of["${n.region}:n${n.id}"]] : [],
        [local.run_dir, name, tostring(n.port), tostring(var.start_timeout_seconds), "--"],
        local.node_argv[name],
      ) : "'${replace(a, "'", "'\\''")}'"
    ])
  }
  node_stop = {
    for name, n in local.nodes : name => join(" ", [
      for a in [local.helper, "stop", local.run_dir, name, tostring(var.stop_timeout_seconds), n.data] : "'${replace(a, "'", "'\\''")}'"
    ])
  }
  ready_check = join(" ", [
    for a in concat([local.helper, "ready", tostring(var.start_timeout_seconds), local.geolog, local.env_file], local.all_addrs) :
    "'${replace(a, "'", "'\\''")}'"
  ])
  pg_env = "GEOLOG_PG_PORT=${local.pg_port} GEOLOG_PG_DIR='${replace(local.pg_dir, "'", "'\\''")}' GEOLOG_PG_GEOLOG='${replace(local.geolog, "'", "'\\''")}'"
  # One KEK file per node (geolog keys add-kek, mode 0600), made once: a
  # node's keyring is wrapped under its KEK, so a restart needs the same.
  kek_make = join(" && ", concat(
    ["mkdir -p '${replace(local.keks_dir, "'", "'\\''")}'", "chmod 700 '${replace(local.keks_dir, "'", "'\\''")}'"],
    [for name in sort(keys(local.nodes)) :
      "{ [ -f '${replace("${local.keks_dir}/${name}.json", "'", "'\\''")}' ] || '${replace(local.geolog, "'", "'\\''")}' keys add-kek --kek-file '${replace("${local.keks_dir}/${name}.json", "'", "'\\''")}' >/dev/null; }"
    ],
  ))
  pki_make = "GEOLOG='${replace(local.geolog, "'", "'\\''")}' ${join(" ", [
    for a in concat(["${local.repo_dir}/scripts/pki.sh", local.certs_dir, "operator"], [for region in var.regions : "${region}=${local.node_count}"]) :
    "'${replace(a, "'", "'\\''")}'"
  ])}"
}

# The run folder. Created first, destroyed last: its destroy sweeps up
# whatever a failed apply left running (Terraform runs no destroy
# provisioner of a resource whose create provisioner failed) and removes
# the folder.
resource "terraform_data" "run_dir" {
  triggers_replace = [local.run_dir]
  input = {
    init  = "'${local.helper}' init '${replace(local.run_dir, "'", "'\\''")}'"
    sweep = "'${local.helper}' sweep '${replace(local.run_dir, "'", "'\\''")}' ${var.stop_timeout_seconds} '${local.pg_script}'"
  }

  lifecycle {
    precondition {
      condition     = local.port_last <= 65535
      error_message = "The port plan ends past 65535 (base_port ${var.base_port}, last port ${local.port_last}): lower base_port."
    }
    precondition {
      condition     = fileexists(local.geologd) && fileexists(local.geolog) && fileexists(local.geolog_wan)
      error_message = "Missing binaries in ${local.bin_dir} (geologd, geolog, geolog-wan): run make build, or set bin_dir."
    }
  }

  provisioner "local-exec" {
    command = self.input.init
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.sweep
  }
}

# The development PKI (tls): made once, removed by destroy.
resource "terraform_data" "pki" {
  count      = var.tls ? 1 : 0
  depends_on = [terraform_data.run_dir]

  triggers_replace = [local.pki_make]
  input = {
    make   = local.pki_make
    remove = "rm -rf '${replace(local.certs_dir, "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    command = self.input.make
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.remove
  }
}

# The nodes' KEK files (atrest): made once, removed by destroy.
resource "terraform_data" "keks" {
  count      = var.atrest ? 1 : 0
  depends_on = [terraform_data.run_dir]

  triggers_replace = [local.kek_make]
  input = {
    make   = local.kek_make
    remove = "rm -rf '${replace(local.keks_dir, "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    command = self.input.make
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.remove
  }
}

# PostgreSQL for the lease store, through scripts/pg.sh.
resource "terraform_data" "postgres" {
  count      = var.lease_store ? 1 : 0
  depends_on = [terraform_data.run_dir]

  triggers_replace = [local.pg_dir, local.pg_port]
  input = {
    start = "${local.pg_env} '${local.pg_script}' start"
    stop  = "${local.pg_env} '${local.pg_script}' stop && rm -rf '${replace(local.pg_dir, "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    command = self.input.start
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.stop
  }
}

# One geolog-wan process carrying every cross-region link.
resource "terraform_data" "wan" {
  depends_on = [terraform_data.run_dir]

  triggers_replace = sha256(local.wan_start)
  input = {
    start = local.wan_start
    stop  = local.wan_stop
  }

  provisioner "local-exec" {
    command = self.input.start
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.stop
  }
}

resource "terraform_data" "node" {
  for_each   = local.nodes
  depends_on = [terraform_data.wan, terraform_data.postgres, terraform_data.pki, terraform_data.keks]

  triggers_replace = sha256("${local.node_start[each.key]} ${local.nodes_fingerprint}")
  input = {
    start = local.node_start[each.key]
    stop  = local.node_stop[each.key]
  }

  provisioner "local-exec" {
    command = self.input.start
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.stop
  }
}

# Waits until every node answers, then writes the env file.
resource "terraform_data" "ready" {
  depends_on = [terraform_data.node]

  triggers_replace = sha256(jsonencode([local.ready_check, local.env_content, local.nodes_fingerprint, local.wan_start]))
  input = {
    check    = local.ready_check
    env      = local.env_content
    env_file = local.env_file
    certs    = var.tls ? "${local.certs_dir}/client" : ""
    remove   = "rm -f '${replace(local.env_file, "'", "'\\''")}'"
  }

  provisioner "local-exec" {
    command = self.input.check
    environment = {
      GEOLOG_TF_ENV    = self.input.env
      GEOLOG_CERTS_DIR = self.input.certs
    }
  }

  provisioner "local-exec" {
    when    = destroy
    command = self.input.remove
  }
}
