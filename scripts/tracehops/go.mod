// A module of its own, so that the server's module does not depend on
// golang.org/x/exp for a benchmarking aid.
module github.com/geolog/geolog/scripts/tracehops

go 1.26.0

require golang.org/x/exp v0.0.0-20261014143641-f0251eb4aa3e
