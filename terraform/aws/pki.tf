# The CockroachDB cluster's certificates: one CA, a node certificate per
# CockroachDB node (CN=node, its private address as SAN) and client
# certificates for root (the init node's SQL) and geolog (geologd's lease
# store connection). ECDSA P-256 keeps them small enough for user data.
#
# The private keys live in the Terraform state and reach the instances
# through user data (readable from the instance metadata service by
# processes on that instance): keep the state encrypted and restricted, or
# move the keys to SSM Parameter Store / Secrets Manager (README.md).

resource "tls_private_key" "ca" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "ca" {
  private_key_pem       = tls_private_key.ca.private_key_pem
  is_ca_certificate     = true
  validity_period_hours = 5 * 365 * 24

  subject {
    common_name  = "${var.name} CockroachDB CA"
    organization = "geolog"
  }

  allowed_uses = ["cert_signing", "crl_signing", "digital_signature", "key_encipherment"]
}

resource "tls_private_key" "cockroach_node" {
  for_each    = local.cockroach_nodes_flat
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "cockroach_node" {
  for_each        = local.cockroach_nodes_flat
  private_key_pem = tls_private_key.cockroach_node[each.key].private_key_pem

  subject {
    common_name  = "node"
    organization = "geolog"
  }

  ip_addresses = [each.value.ip, "127.0.0.1"]
  dns_names    = ["localhost", each.value.name]
}

resource "tls_locally_signed_cert" "cockroach_node" {
  for_each              = local.cockroach_nodes_flat
  cert_request_pem      = tls_cert_request.cockroach_node[each.key].cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 2 * 365 * 24
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth", "client_auth"]
}

resource "tls_private_key" "client" {
  for_each    = toset(["root", "geolog"])
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "client" {
  for_each        = tls_private_key.client
  private_key_pem = each.value.private_key_pem

  subject {
    common_name  = each.key
    organization = "geolog"
  }
}

resource "tls_locally_signed_cert" "client" {
  for_each              = tls_cert_request.client
  cert_request_pem      = each.value.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 2 * 365 * 24
  allowed_uses          = ["digital_signature", "key_encipherment", "client_auth"]
}

# geolog's own PKI, apart from CockroachDB's: a CA, a certificate per
# geologd naming its identity (URI SAN geolog://node/<region>/<id>, its
# private address as IP SAN), good as server and client (nodes dial each
# other), and a client certificate for the operator principal. geologd
# serves and dials with TLS (--certs-dir /etc/geolog/tls) and takes
# node-to-node services from node identities only (docs/security.md).

resource "tls_private_key" "geolog_ca" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "geolog_ca" {
  private_key_pem       = tls_private_key.geolog_ca.private_key_pem
  is_ca_certificate     = true
  validity_period_hours = 5 * 365 * 24

  subject {
    common_name  = "${var.name} geolog CA"
    organization = "geolog"
  }

  allowed_uses = ["cert_signing", "crl_signing"]
}

resource "tls_private_key" "geolog_node" {
  for_each    = local.geolog_nodes_flat
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "geolog_node" {
  for_each        = local.geolog_nodes_flat
  private_key_pem = tls_private_key.geolog_node[each.key].private_key_pem

  subject {
    common_name  = "node ${each.value.region}/${each.value.id}"
    organization = "geolog"
  }

  uris         = ["geolog://node/${each.value.region}/${each.value.id}"]
  ip_addresses = [each.value.ip, "127.0.0.1"]
  dns_names    = ["localhost", each.value.name]
}

resource "tls_locally_signed_cert" "geolog_node" {
  for_each              = local.geolog_nodes_flat
  cert_request_pem      = tls_cert_request.geolog_node[each.key].cert_request_pem
  ca_private_key_pem    = tls_private_key.geolog_ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.geolog_ca.cert_pem
  validity_period_hours = 365 * 24
  allowed_uses          = ["digital_signature", "server_auth", "client_auth"]
}

resource "tls_private_key" "geolog_operator" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "geolog_operator" {
  private_key_pem = tls_private_key.geolog_operator.private_key_pem

  subject {
    common_name  = "operator"
    organization = "geolog"
  }

  uris = ["geolog://client/operator"]
}

resource "tls_locally_signed_cert" "geolog_operator" {
  cert_request_pem      = tls_cert_request.geolog_operator.cert_request_pem
  ca_private_key_pem    = tls_private_key.geolog_ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.geolog_ca.cert_pem
  validity_period_hours = 365 * 24
  allowed_uses          = ["digital_signature", "client_auth"]
}
