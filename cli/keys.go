package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/geolog/geolog/atrest"
)

const keysUsage = `usage (offline: on a node's data directory, the node stopped):
  keys list --data-dir DIR --kek-file FILE [--json]
      the node's data keys: id, creation time, the KEK that wraps each, which
      one is active (seals new writes)
  keys rotate --data-dir DIR --kek-file FILE
      start a new data key: writes from now on are sealed under it; frames
      sealed before stay readable under their keys
  keys retire --data-dir DIR --kek-file FILE --key ID
      remove an old data key from the keyring, once no segment or orphan log
      of the data directory holds a frame under it (the node re-encrypts
      them in the background after a rotation; the command checks every
      file and refuses while one does)
  keys rewrap --data-dir DIR --kek-file FILE
      KEK rotation: wrap every data key under the KEK file's current (last)
      KEK; data and data keys are unchanged
  keys add-kek --kek-file FILE
      add a new random KEK to the KEK file (created, mode 0600, if missing)
      as its current one; then rewrap every node (or restart it: a node
      rewraps at startup)
  keys remove-kek --kek-file FILE --kek ID
      remove an old KEK from the file once no node's keys are wrapped by it`

// keys runs the key-management commands (see keysUsage).
func (e *env) keys(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("%s", keysUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.flagSet("keys " + sub)
	dataDir := fs.String("data-dir", "", "the node's data directory")
	kekFile := fs.String("kek-file", "", "the KEK file (geologd --kek-file)")
	kekID := fs.String("kek", "", "KEK id (remove-kek)")
	keyID := fs.String("key", "", "data key id (retire)")
	asJSON := fs.Bool("json", false, "print as JSON (list)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *kekFile == "" {
		return usagef("%s", keysUsage)
	}
	switch sub {
	case "add-kek":
		id, err := atrest.AddKEK(*kekFile)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "added KEK %s to %s\n", id, *kekFile)
		return nil
	case "remove-kek":
		if *kekID == "" {
			return usagef("%s", keysUsage)
		}
		if err := atrest.RemoveKEK(*kekFile, *kekID); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "removed KEK %s from %s\n", *kekID, *kekFile)
		return nil
	case "list", "rotate", "rewrap", "retire":
	default:
		return usagef("%s", keysUsage)
	}
	if *dataDir == "" {
		return usagef("%s", keysUsage)
	}
	kek, err := atrest.OpenKEKFile(*kekFile)
	if err != nil {
		return err
	}
	k, err := atrest.Open(ctx, atrest.Config{Dir: atrest.NodeKeysDir(*dataDir), KEK: kek})
	if err != nil {
		return err
	}
	defer k.Close()
	switch sub {
	case "rotate":
		info, err := k.Rotate(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "active data key %v (wrapped by %s)\n", info.ID, info.KEK)
		return nil
	case "retire":
		return e.keysRetire(k, *dataDir, *keyID)
	case "rewrap":
		cur, n, err := k.Rewrap(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "rewrapped %d data keys under KEK %s\n", n, cur)
		return nil
	}
	return e.printKeys(k.Keys(), *asJSON)
}

func (e *env) printKeys(keys []atrest.KeyInfo, asJSON bool) error {
	if asJSON {
		type key struct {
			ID      string    `json:"id"`
			Created time.Time `json:"created"`
			KEK     string    `json:"kek"`
			Active  bool      `json:"active"`
		}
		out := make([]key, len(keys))
		for i, k := range keys {
			out[i] = key{ID: k.ID.String(), Created: k.Created, KEK: k.KEK, Active: k.Active}
		}
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tKEK\tACTIVE")
	for _, k := range keys {
		fmt.Fprintf(tw, "%v\t%s\t%s\t%v\n", k.ID, k.Created.UTC().Format(time.RFC3339), k.KEK, k.Active)
	}
	return tw.Flush()
}
