locals {
  tags = merge(var.tags, { Deployment = var.name })

  # The address plan. Every private address is fixed here, before any
  # instance exists, so that a node's flags (--peers, --region-addrs,
  # --join) can name nodes of other regions without a dependency cycle.
  # In region r's VPC (a /16), availability zone z has subnet
  # cidrsubnet(cidr, 8, z); geologd node n (0-based) sits in zone
  # n mod zones at host 10 + n, CockroachDB node n at host 100 + n.
  regions = [
    for i, r in var.regions : merge(r, {
      index        = i
      subnet_cidrs = [for z in range(length(r.azs)) : cidrsubnet(r.cidr, 8, z)]
    })
  ]
  region_by_name = { for r in local.regions : r.name => r }

  geolog_nodes = {
    for r in local.regions : r.name => [
      for n in range(var.geolog_nodes_per_region) : {
        name     = "${r.name}-geolog-${n + 1}"
        id       = n + 1
        az_index = n % length(r.azs)
        az       = r.azs[n % length(r.azs)]
        ip       = cidrhost(r.subnet_cidrs[n % length(r.azs)], 10 + n)
      }
    ]
  }
  cockroach_nodes = {
    for r in local.regions : r.name => [
      for n in range(var.cockroach_nodes_per_region) : {
        name     = "${r.name}-cockroach-${n + 1}"
        key      = "${r.name}-${n + 1}"
        az_index = n % length(r.azs)
        az       = r.azs[n % length(r.azs)]
        ip       = cidrhost(r.subnet_cidrs[n % length(r.azs)], 100 + n)
      }
    ]
  }
  cockroach_nodes_flat = { for n in flatten(values(local.cockroach_nodes)) : n.key => n }
  geolog_nodes_flat = merge([
    for r, nodes in local.geolog_nodes : { for n in nodes : n.name => merge(n, { region = r }) }
  ]...)

  geolog_addrs = { for r, nodes in local.geolog_nodes : r => [for n in nodes : "${n.ip}:${var.geolog_port}"] }

  # CockroachDB joins through up to three nodes of every region.
  cockroach_join = join(",", flatten([
    for r in local.regions : [for n in slice(local.cockroach_nodes[r.name], 0, min(3, var.cockroach_nodes_per_region)) : "${n.ip}:26257"]
  ]))

  # The lease database's regions are CockroachDB localities, which are the
  # AWS region names (--locality=region=<aws_region>); geolog's region
  # names map to them.
  lease_primary    = var.lease_primary_region != "" ? local.region_by_name[var.lease_primary_region].aws_region : local.regions[0].aws_region
  lease_region_map = { for r in local.regions : r.name => r.aws_region }

  # geologd reaches the lease store through the CockroachDB nodes of its
  # own region (pgx tries the hosts in order; node n starts at the n-th so
  # the gateways share the load), over TLS with the geolog client cert.
  cert_dir = "/etc/geolog/certs"
  # geologd's own TLS folder (--certs-dir): ca.crt, node.crt, node.key.
  tls_dir = "/etc/geolog/tls"
  lease_url = {
    for r in local.regions : r.name => [
      for n in range(var.geolog_nodes_per_region) : format(
        "postgresql://geolog@%s/%s?sslmode=verify-full&sslrootcert=%s/ca.crt&sslcert=%s/client.geolog.crt&sslkey=%s/client.geolog.key",
        join(",", [
          for k in range(var.cockroach_nodes_per_region) :
          "${local.cockroach_nodes[r.name][(n + k) % var.cockroach_nodes_per_region].ip}:26257"
        ]),
        var.lease_database, local.cert_dir, local.cert_dir, local.cert_dir,
      )
    ]
  }

  geologd_args = {
    for r in local.regions : r.name => [
      for n in local.geolog_nodes[r.name] : concat(
        [
          "--data-dir", "/var/lib/geolog/data",
          "--listen", "${n.ip}:${var.geolog_port}",
          "--region", r.name,
          "--node-id", tostring(n.id),
          "--peers", join(",", [for p in local.geolog_nodes[r.name] : "${p.id}=${p.ip}:${var.geolog_port}"]),
          "--fsync", var.geologd_fsync,
          "--debug-addr", "${n.ip}:${var.geolog_debug_port}",
          "--log-json",
        ],
        flatten([for o in local.regions : ["--region-addrs", "${o.name}=${join(",", local.geolog_addrs[o.name])}"] if o.name != r.name]),
        var.geologd_extra_args,
      )
    ]
  }

  # Flags passed only where the installed geologd lists them in --help.
  geologd_optional_args = {
    for r in local.regions : r.name => [
      for n in local.geolog_nodes[r.name] : concat(
        # A geologd from before TLS has no --certs-dir; one after needs it.
        [["--certs-dir", local.tls_dir]],
        var.lease_store ? [
          ["--lease-store", local.lease_url[r.name][n.id - 1]],
          ["--lease-ttl", var.lease_ttl],
          ["--max-clock-offset", var.max_clock_offset],
        ] : [],
      )
    ]
  }

  geologd_user_data = {
    for r in local.regions : r.name => [
      for n in local.geolog_nodes[r.name] : templatefile("${path.module}/templates/geologd.yaml.tftpl", {
        node_name      = n.name
        geologd_url    = var.geologd_url
        geologd_sha256 = var.geologd_sha256
        args           = local.geologd_args[r.name][n.id - 1]
        optional_args  = local.geologd_optional_args[r.name][n.id - 1]
        run_script     = file("${path.module}/files/run-geologd.sh")
        cert_dir       = local.cert_dir
        ca_cert        = tls_self_signed_cert.ca.cert_pem
        client_cert    = var.lease_store ? tls_locally_signed_cert.client["geolog"].cert_pem : ""
        client_key     = var.lease_store ? tls_private_key.client["geolog"].private_key_pem_pkcs8 : ""
        tls_dir        = local.tls_dir
        geolog_ca_cert = tls_self_signed_cert.geolog_ca.cert_pem
        node_cert      = tls_locally_signed_cert.geolog_node[n.name].cert_pem
        node_key       = tls_private_key.geolog_node[n.name].private_key_pem_pkcs8
      })
    ]
  }

  cockroach_init_node = local.cockroach_nodes[local.regions[0].name][0]

  cockroach_user_data = {
    for r in local.regions : r.name => [
      for n in local.cockroach_nodes[r.name] : templatefile("${path.module}/templates/cockroach.yaml.tftpl", {
        node_name        = n.name
        ip               = n.ip
        join             = local.cockroach_join
        locality         = "region=${r.aws_region},zone=${n.az}"
        max_offset       = var.max_clock_offset
        cockroach_url    = var.cockroach_url
        cockroach_sha256 = var.cockroach_sha256
        ca_cert          = tls_self_signed_cert.ca.cert_pem
        node_cert        = tls_locally_signed_cert.cockroach_node[n.key].cert_pem
        node_key         = tls_private_key.cockroach_node[n.key].private_key_pem_pkcs8
        # The first node of the first region initialises the cluster and the
        # lease database (files/leases-init.sh).
        init        = n.key == local.cockroach_init_node.key
        root_cert   = n.key == local.cockroach_init_node.key ? tls_locally_signed_cert.client["root"].cert_pem : ""
        root_key    = n.key == local.cockroach_init_node.key ? tls_private_key.client["root"].private_key_pem_pkcs8 : ""
        init_script = file("${path.module}/files/leases-init.sh")
        leases_env = join("\n", [
          "COCKROACH_HOST=${n.ip}:26257",
          "REGION_COUNT=${length(local.regions)}",
          "LEASE_DATABASE=${var.lease_database}",
        ])
        leases_db_sql = templatefile("${path.module}/templates/leases-db.sql.tftpl", {
          database = var.lease_database
          primary  = local.lease_primary
          others   = [for r in local.regions : r.aws_region if r.aws_region != local.lease_primary]
          survival = upper(var.survival_goal)
        })
        leases_locality_sql = templatefile("${path.module}/templates/leases-locality.sql.tftpl", {
          region_map = local.lease_region_map
          primary    = local.lease_primary
        })
      })
    ]
  }
}
