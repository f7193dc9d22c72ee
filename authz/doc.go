// Package authz is the pure core of geolog's authorization: permissions,
// access rules with wildcards, and the decision whether a principal holds
// a permission on a resource. It does no I/O; the server's interceptor
// (regionsvc/authz.go) names the principal and the resource of each call
// and asks a Policy.
//
// A RuleSet is the rules in force built from versioned changes applied in
// any order (the catalogue's access rules, regionsvc/acl.go), and a
// TokenVerifier checks bearer tokens (JWT) and names their principal
// ("jwt:<sub>"), on the clock its TokenConfig gives it (time.Now by
// default).
//
// Names:
//
//   - a principal is a client's name as its certificate gives it
//     ("alice"), a bearer token's ("jwt:<sub>"), or a node's
//     ("node:<region>/<id>"); nodes are decided before any rule, by the
//     caller, and never here;
//   - a resource is a stream name for the stream permissions (produce,
//     consume, describe, admin), and a consumer group or cursor name for
//     the group permission;
//   - a pattern is an exact name, "*" (anything), or a prefix followed by
//     "*" ("jwt:*", "chat.*"); no other character is special.
//
// A method that names no stream (ListStreams) or no group is checked
// against the empty resource, which only "*" matches.
package authz
