package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	geologv1 "github.com/geolog/geolog/proto/geologv1"
)

const aclUsage = `usage:
  acl add <principal> <resource> <perm[,perm...]> [--json]
      set the access rule of principal on resource, in every region: it
      grants the permissions listed (produce, consume, describe, admin,
      group), replacing the pair's rule if it has one. principal is a
      certificate's principal, jwt:<sub> for a bearer token's, or a prefix*
      pattern; resource a stream (or, for group, a consumer group or
      cursor) name or a prefix* pattern. Needs admin on resource.
  acl list [--resource PATTERN] [--json]
      the rules in force whose resource PATTERN covers (default: every
      rule; needs admin on PATTERN).
  acl remove <principal> <resource>
      remove the pair's rule, in every region. Needs admin on resource.`

// aclRow is one rule as list and add print it.
type aclRow struct {
	Principal   string   `json:"principal"`
	Resource    string   `json:"resource"`
	Permissions []string `json:"permissions"`
	Changed     string   `json:"changed"`
	Region      string   `json:"changed_in_region"`
}

func toACLRow(r *geologv1.AclRule) aclRow {
	return aclRow{Principal: r.GetPrincipal(), Resource: r.GetResource(), Permissions: append([]string{}, r.GetPermissions()...),
		Changed: time.Unix(0, r.GetChangedUnixNanos()).UTC().Format(time.RFC3339), Region: r.GetChangedInRegion()}
}

// acl runs the access rule commands.
func (e *env) acl(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", aclUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet("acl " + sub)
	asJSON := fs.Bool("json", false, "print as JSON (add, list)")
	resource := fs.String("resource", "", "list: only rules whose resource this pattern covers")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case sub == "add" && len(pos) == 3, sub == "list" && len(pos) == 0, sub == "remove" && len(pos) == 2:
	default:
		return usagef("%s", aclUsage)
	}
	a, err := e.adminDialer()
	if err != nil {
		return err
	}
	defer a.close()
	switch sub {
	case "add":
		var perms []string
		for _, p := range strings.Split(pos[2], ",") {
			if p = strings.TrimSpace(p); p != "" {
				perms = append(perms, p)
			}
		}
		var resp *geologv1.PutAclResponse
		err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
			var err error
			resp, err = c.PutAcl(ctx, &geologv1.PutAclRequest{Rule: &geologv1.AclRule{Principal: pos[0], Resource: pos[1], Permissions: perms}})
			return err
		})
		if err != nil {
			return err
		}
		return e.printACLs([]*geologv1.AclRule{resp.GetRule()}, *asJSON)
	case "list":
		var resp *geologv1.ListAclsResponse
		err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
			var err error
			resp, err = c.ListAcls(ctx, &geologv1.ListAclsRequest{Resource: *resource})
			return err
		})
		if err != nil {
			return err
		}
		return e.printACLs(resp.GetRules(), *asJSON)
	default:
		var resp *geologv1.DeleteAclResponse
		err := a.call(ctx, e.timeout, func(ctx context.Context, c geologv1.AdminClient) error {
			var err error
			resp, err = c.DeleteAcl(ctx, &geologv1.DeleteAclRequest{Principal: pos[0], Resource: pos[1]})
			return err
		})
		if err != nil {
			return err
		}
		if resp.GetExisted() {
			fmt.Fprintf(e.stdout, "removed the rule of %s on %s\n", pos[0], pos[1])
		} else {
			fmt.Fprintf(e.stdout, "%s had no rule on %s (none is in force now)\n", pos[0], pos[1])
		}
		return nil
	}
}

func (e *env) printACLs(rules []*geologv1.AclRule, asJSON bool) error {
	rows := make([]aclRow, 0, len(rules))
	for _, r := range rules {
		rows = append(rows, toACLRow(r))
	}
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tRESOURCE\tPERMISSIONS\tCHANGED\tREGION")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Principal, r.Resource, strings.Join(r.Permissions, ","), r.Changed, r.Region)
	}
	return tw.Flush()
}
