// Package pki is geolog's transport security: who a certificate names, a
// development PKI (what `geolog certs` makes), and TLS material that
// reloads from files without a restart. docs/security.md is the operators'
// account of all of it.
//
// # Identities
//
// A certificate names exactly one geolog identity, in a URI SAN:
//
//   - geolog://node/<region>/<node-id>: a node, with its Raft id in its
//     region. Its certificate also carries an IP or DNS SAN for every
//     address it is dialed by, and is good for TLS server and client
//     authentication (a node serves, and dials other nodes).
//   - geolog://client/<principal>: a client principal (an application, an
//     operator). Good for client authentication only, so it can never
//     pass for a server.
//
// A node accepts node-to-node services (Raft, Mirror, the internal Admin
// calls, forwarded and propagated requests) from node identities only;
// regionsvc applies the rules, PeerIdentity reads the identity of a gRPC
// caller from the certificate the server verified.
//
// # Reload contract
//
//  1. OpenFiles reads the CA bundle, certificate and key, and refuses a
//     set that does not hold together: a key that is not the
//     certificate's, a certificate not signed by the bundle or not valid
//     now, or one that names no identity.
//  2. ServerTLS and ClientCredentials read the material of the moment at every
//     handshake. A Reload (file change seen by Watch's poll, or a trigger
//     such as SIGHUP) swaps it atomically: new connections use the new
//     pair and bundle, open connections carry on as they are.
//  3. A reload that fails the checks of step 1, or whose certificate names
//     another identity than the first, changes nothing and is logged; the
//     next change of the files is tried again.
//  4. Files are written (WritePair, WriteCACopy) atomically with mode 0600,
//     the key before the certificate, so a poll between the two sees a
//     mismatched pair (refused, step 3), never half a file.
package pki
