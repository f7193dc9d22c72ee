package cli

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/template"
)

// output is a command's choice of form: a table (the default), --json, or
// --format TEMPLATE, a Go text/template run over the JSON form's fields (by
// their JSON names, as kubectl's go-template output does): once per element
// when the JSON form is a list, else once, each followed by a newline.
//
//	geolog streams list --format '{{.name}} {{.range_count}}'
//	geolog consume chat --format '{{.offset}} {{.value}}'
type output struct {
	asJSON *bool
	format *string
	tmpl   *template.Template
}

// templateFuncs are the functions a --format template may call besides
// text/template's own.
var templateFuncs = template.FuncMap{
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"join":  func(sep string, v []any) string { return joinAny(v, sep) },
	"upper": strings.ToUpper,
	"lower": strings.ToLower,
}

func joinAny(v []any, sep string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, sep)
}

// outputFlags registers --json and --format on fs.
func outputFlags(fs *flag.FlagSet, jsonHelp string) *output {
	return &output{
		asJSON: fs.Bool("json", false, jsonHelp),
		format: fs.String("format", "", "print each item through this Go template over its JSON fields, e.g. '{{.name}}'"),
	}
}

// check parses the template (after the flags are parsed).
func (o *output) check() error {
	if *o.format == "" {
		return nil
	}
	if *o.asJSON {
		return usagef("--json and --format exclude each other")
	}
	t, err := template.New("format").Funcs(templateFuncs).Option("missingkey=error").Parse(*o.format)
	if err != nil {
		return usagef("--format: %v", err)
	}
	o.tmpl = t
	return nil
}

// structured reports whether the output is --json or --format.
func (o *output) structured() bool { return *o.asJSON || o.tmpl != nil }

// write prints v, the JSON form, as --json or --format asks.
func (o *output) write(w io.Writer, v any) error {
	if o.tmpl == nil {
		return json.NewEncoder(w).Encode(v)
	}
	generic, err := toGeneric(v)
	if err != nil {
		return err
	}
	items, ok := generic.([]any)
	if !ok {
		items = []any{generic}
	}
	var buf bytes.Buffer
	for _, it := range items {
		if err := o.tmpl.Execute(&buf, it); err != nil {
			return usagef("--format: %v", err)
		}
		buf.WriteByte('\n')
	}
	_, err = w.Write(buf.Bytes())
	return err
}

// toGeneric turns v into what encoding/json decodes its JSON form to, with
// numbers kept exact (json.Number: offsets are 64-bit).
func toGeneric(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	err = dec.Decode(&out)
	return out, err
}
