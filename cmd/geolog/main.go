// Command geolog is the geolog command-line client; see package cli.
package main

import (
	"os"

	"github.com/geolog/geolog/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
