// Package terraform holds geolog's Terraform modules — local/ (a test
// cluster on this machine, built from terraform_data and local-exec only)
// and aws/ (a three-region deployment) — and Check, a static checker of
// their references.
//
// Terraform itself can only check references with `terraform validate`,
// which needs every provider downloaded; Check needs none. It parses every
// .tf file of a module directory with hclsyntax and reports:
//
//  1. var.X without a variable "X" block; variables declared but never used;
//  2. local.X without a locals entry X; locals never used;
//  3. TYPE.NAME and data.TYPE.NAME without that resource or data block;
//  4. module.NAME without that module block; module.NAME.OUT without an
//     output "OUT" in a local child module; module arguments the child does
//     not declare, and child variables without default that are not passed;
//  5. provider = P.ALIAS and providers = { ... = P.ALIAS } without that
//     provider configuration or configuration_aliases entry;
//  6. count.* outside a block with count, each.* outside one with for_each,
//     self outside a resource;
//  7. file(), filebase64() and templatefile() paths (those that evaluate with
//     only path.module known) that do not exist, and every variable a
//     template uses that the templatefile() call does not pass.
//
// Expressions are checked wherever they appear: resources, provisioners,
// lifecycle conditions, outputs, locals, provider and module blocks.
// Attribute names of resources are not checked (that needs provider schemas).
package terraform

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// CheckTree checks every module directory (a directory holding .tf files)
// under root, skipping .terraform and run directories. It returns the
// module directories it checked and the problems found, each as
// "file:line: message", sorted. The error is for an unreadable tree only.
func CheckTree(root string) (modules []string, problems []string, err error) {
	dirs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == ".terraform" || d.Name() == "run" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".tf") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for dir := range dirs {
		modules = append(modules, dir)
	}
	sort.Strings(modules)
	for _, dir := range modules {
		p, err := CheckModule(dir)
		if err != nil {
			return nil, nil, err
		}
		problems = append(problems, p...)
	}
	return modules, problems, nil
}

// CheckModule checks the module in dir (its .tf files, not subdirectories)
// and the calls it makes to local child modules. Problems are sorted.
func CheckModule(dir string) ([]string, error) {
	m, problems, err := loadModule(dir)
	if err != nil {
		return nil, err
	}
	c := &checker{m: m, problems: problems, usedVars: map[string]bool{}, usedLocals: map[string]bool{}, children: map[string]*module{}}
	c.check()
	sort.Strings(c.problems)
	return slices.Compact(c.problems), nil
}

// module is what one directory declares.
type module struct {
	dir       string
	files     []*hcl.File
	variables map[string]variableDecl
	locals    map[string]hcl.Range
	resources map[string]bool // "type.name"
	data      map[string]bool // "type.name"
	calls     map[string]*hclsyntax.Block
	outputs   map[string]bool
	providers map[string]bool // "aws" and "aws.alias"
	// configAliases are the configuration_aliases of required_providers:
	// every caller must pass each of them.
	configAliases map[string]bool
}

type variableDecl struct {
	hasDefault bool
	rng        hcl.Range
}

func loadModule(dir string) (*module, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	m := &module{
		dir:       dir,
		variables: map[string]variableDecl{},
		locals:    map[string]hcl.Range{},
		resources: map[string]bool{},
		data:      map[string]bool{},
		calls:     map[string]*hclsyntax.Block{},
		outputs:   map[string]bool{},
		providers: map[string]bool{},

		configAliases: map[string]bool{},
	}
	var problems []string
	parser := hclparse.NewParser()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".tf") {
			continue
		}
		f, diags := parser.ParseHCLFile(filepath.Join(dir, e.Name()))
		for _, d := range diags {
			problems = append(problems, diagString(d))
		}
		if diags.HasErrors() {
			continue
		}
		m.files = append(m.files, f)
		body := f.Body.(*hclsyntax.Body)
		for _, b := range body.Blocks {
			m.declare(b, &problems)
		}
	}
	return m, problems, nil
}

func (m *module) declare(b *hclsyntax.Block, problems *[]string) {
	dup := func(kind, name string) {
		*problems = append(*problems, at(b.DefRange(), "%s %q is declared twice", kind, name))
	}
	switch b.Type {
	case "variable":
		name := b.Labels[0]
		if _, ok := m.variables[name]; ok {
			dup("variable", name)
		}
		_, hasDefault := b.Body.Attributes["default"]
		m.variables[name] = variableDecl{hasDefault: hasDefault, rng: b.DefRange()}
	case "locals":
		for name, a := range b.Body.Attributes {
			if _, ok := m.locals[name]; ok {
				dup("local", name)
			}
			m.locals[name] = a.SrcRange
		}
	case "resource", "data":
		key := b.Labels[0] + "." + b.Labels[1]
		set := m.resources
		if b.Type == "data" {
			set = m.data
		}
		if set[key] {
			dup(b.Type, key)
		}
		set[key] = true
	case "module":
		if m.calls[b.Labels[0]] != nil {
			dup("module", b.Labels[0])
		}
		m.calls[b.Labels[0]] = b
	case "output":
		if m.outputs[b.Labels[0]] {
			dup("output", b.Labels[0])
		}
		m.outputs[b.Labels[0]] = true
	case "provider":
		name := b.Labels[0]
		m.providers[name] = true
		if a, ok := b.Body.Attributes["alias"]; ok {
			if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.Type() == cty.String {
				m.providers[name+"."+v.AsString()] = true
			}
		}
	case "terraform":
		for _, rp := range b.Body.Blocks {
			if rp.Type != "required_providers" {
				continue
			}
			for name, a := range rp.Body.Attributes {
				m.providers[name] = true
				obj, ok := a.Expr.(*hclsyntax.ObjectConsExpr)
				if !ok {
					continue
				}
				for _, item := range obj.Items {
					if key, ok := staticString(item.KeyExpr); !ok || key != "configuration_aliases" {
						continue
					}
					for _, t := range hclsyntax.Variables(item.ValueExpr) {
						m.providers[traversalString(t)] = true
						m.configAliases[traversalString(t)] = true
					}
				}
			}
		}
	}
}

// scope is what a block lets its expressions refer to beyond the module's
// declarations.
type scope struct {
	count, forEach, self bool
	iterators            map[string]bool // dynamic blocks' iterators
}

func (s scope) with(iterator string) scope {
	its := map[string]bool{iterator: true}
	for k := range s.iterators {
		its[k] = true
	}
	s.iterators = its
	return s
}

type checker struct {
	m          *module
	problems   []string
	usedVars   map[string]bool
	usedLocals map[string]bool
	children   map[string]*module // by module call name; nil when not local
}

func (c *checker) report(rng hcl.Range, format string, args ...any) {
	c.problems = append(c.problems, at(rng, format, args...))
}

func (c *checker) check() {
	for _, f := range c.m.files {
		for _, b := range f.Body.(*hclsyntax.Body).Blocks {
			c.topBlock(b)
		}
	}
	for name, v := range c.m.variables {
		if !c.usedVars[name] {
			c.report(v.rng, "variable %q is declared but never used", name)
		}
	}
	for name, rng := range c.m.locals {
		if !c.usedLocals[name] {
			c.report(rng, "local %q is declared but never used", name)
		}
	}
}

func (c *checker) topBlock(b *hclsyntax.Block) {
	switch b.Type {
	case "terraform", "moved", "removed", "import":
		// Declarations and addresses, not expressions.
	case "variable":
		// type is a type expression; validation may only use this variable.
		c.body(b.Body, scope{}, "type")
	case "resource", "data":
		sc := scope{self: b.Type == "resource"}
		_, sc.count = b.Body.Attributes["count"]
		_, sc.forEach = b.Body.Attributes["for_each"]
		if a, ok := b.Body.Attributes["provider"]; ok {
			c.providerRef(a.Expr)
		}
		c.body(b.Body, sc, "provider")
	case "module":
		c.moduleCall(b)
	default: // locals, output, provider, check
		c.body(b.Body, scope{})
	}
}

// body checks every attribute expression of b (but those named in skip)
// and its nested blocks.
func (c *checker) body(b *hclsyntax.Body, sc scope, skip ...string) {
	for name, a := range b.Attributes {
		if slices.Contains(skip, name) {
			continue
		}
		c.expr(a.Expr, sc)
	}
	for _, nb := range b.Blocks {
		switch nb.Type {
		case "lifecycle":
			// ignore_changes lists attribute names, not references.
			c.body(nb.Body, sc, "ignore_changes")
		case "provisioner":
			// when = destroy and on_failure = continue are keywords.
			c.body(nb.Body, sc, "when", "on_failure")
		case "dynamic":
			if a, ok := nb.Body.Attributes["for_each"]; ok {
				c.expr(a.Expr, sc)
			}
			iterator := nb.Labels[0]
			if a, ok := nb.Body.Attributes["iterator"]; ok {
				if t, diags := hcl.AbsTraversalForExpr(a.Expr); !diags.HasErrors() {
					iterator = t.RootName()
				}
			}
			inner := sc.with(iterator)
			for name, a := range nb.Body.Attributes {
				if name != "for_each" && name != "iterator" {
					c.expr(a.Expr, inner)
				}
			}
			for _, content := range nb.Body.Blocks {
				c.body(content.Body, inner)
			}
		default:
			c.body(nb.Body, sc)
		}
	}
}

func (c *checker) moduleCall(b *hclsyntax.Block) {
	sc := scope{}
	_, sc.count = b.Body.Attributes["count"]
	_, sc.forEach = b.Body.Attributes["for_each"]
	child := c.child(b.Labels[0])
	meta := []string{"source", "version", "providers", "count", "for_each", "depends_on"}
	passedProviders := map[string]bool{}
	for name, a := range b.Body.Attributes {
		if name == "providers" {
			passedProviders = c.moduleProviders(a.Expr, child)
			continue
		}
		if name != "source" && name != "version" {
			c.expr(a.Expr, sc)
		}
		if child != nil && !slices.Contains(meta, name) {
			if _, ok := child.variables[name]; !ok {
				c.report(a.SrcRange, "module %q: %s has no variable %q", b.Labels[0], child.dir, name)
			}
		}
	}
	if child == nil {
		return
	}
	for name, v := range child.variables {
		if _, passed := b.Body.Attributes[name]; !passed && !v.hasDefault {
			c.report(b.DefRange(), "module %q: required variable %q of %s is not passed", b.Labels[0], name, child.dir)
		}
	}
	for alias := range child.configAliases {
		if !passedProviders[alias] {
			c.report(b.DefRange(), "module %q: provider %s (configuration_aliases of %s) is not passed in providers", b.Labels[0], alias, child.dir)
		}
	}
}

// moduleProviders checks a module block's providers map and returns the
// child's provider names it passes.
func (c *checker) moduleProviders(expr hclsyntax.Expression, child *module) map[string]bool {
	passed := map[string]bool{}
	obj, ok := expr.(*hclsyntax.ObjectConsExpr)
	if !ok {
		c.report(expr.Range(), "providers must be an object of provider references")
		return passed
	}
	for _, item := range obj.Items {
		if t, diags := hcl.AbsTraversalForExpr(item.KeyExpr); !diags.HasErrors() {
			key := traversalString(t)
			passed[key] = true
			// An unaliased provider needs no declaration in the child.
			if child != nil && len(t) > 1 && !child.providers[key] {
				c.report(item.KeyExpr.Range(), "providers: the child module declares no provider %q", key)
			}
		}
		c.providerRef(item.ValueExpr)
	}
	return passed
}

func (c *checker) providerRef(expr hclsyntax.Expression) {
	t, diags := hcl.AbsTraversalForExpr(expr)
	if diags.HasErrors() {
		c.report(expr.Range(), "a provider reference must be NAME or NAME.ALIAS")
		return
	}
	if key := traversalString(t); len(t) > 1 && !c.m.providers[key] {
		c.report(expr.Range(), "provider %s is not configured in %s (no provider block with that alias, no configuration_aliases entry)", key, c.m.dir)
	}
}

// child loads the module a module block calls when its source is a local
// path; nil otherwise (a registry or git source cannot be checked here).
func (c *checker) child(name string) *module {
	if m, ok := c.children[name]; ok {
		return m
	}
	c.children[name] = nil
	b := c.m.calls[name]
	a, ok := b.Body.Attributes["source"]
	if !ok {
		c.report(b.DefRange(), "module %q has no source", name)
		return nil
	}
	src, ok := staticString(a.Expr)
	if !ok || !(strings.HasPrefix(src, "./") || strings.HasPrefix(src, "../")) {
		return nil
	}
	dir := filepath.Join(c.m.dir, src)
	m, problems, err := loadModule(dir)
	if err != nil || len(m.files) == 0 {
		c.report(a.SrcRange, "module %q: source %s has no .tf files", name, dir)
		return nil
	}
	_ = problems // reported when that directory is checked itself
	c.children[name] = m
	return m
}

// expr checks every reference in e and every file it names.
func (c *checker) expr(e hclsyntax.Expression, sc scope) {
	for _, t := range hclsyntax.Variables(e) {
		c.reference(t, sc)
	}
	hclsyntax.VisitAll(e, func(n hclsyntax.Node) hcl.Diagnostics {
		if call, ok := n.(*hclsyntax.FunctionCallExpr); ok {
			c.fileCall(call)
		}
		return nil
	})
}

func (c *checker) reference(t hcl.Traversal, sc scope) {
	rng := t.SourceRange()
	root := t.RootName()
	attr := func(i int) (string, bool) {
		if len(t) <= i {
			return "", false
		}
		a, ok := t[i].(hcl.TraverseAttr)
		return a.Name, ok
	}
	name, hasName := attr(1)
	switch {
	case sc.iterators[root]:
	case root == "var":
		if _, ok := c.m.variables[name]; !hasName || !ok {
			c.report(rng, "var.%s is not declared (no variable %q in %s)", name, name, c.m.dir)
		}
		c.usedVars[name] = true
	case root == "local":
		if _, ok := c.m.locals[name]; !hasName || !ok {
			c.report(rng, "local.%s is not declared in %s", name, c.m.dir)
		}
		c.usedLocals[name] = true
	case root == "module":
		if !hasName || c.m.calls[name] == nil {
			c.report(rng, "module.%s: no module %q in %s", name, name, c.m.dir)
			return
		}
		out, hasOut := attr(2)
		if child := c.child(name); child != nil && hasOut && !child.outputs[out] {
			c.report(rng, "module.%s.%s: %s has no output %q", name, out, child.dir, out)
		}
	case root == "data":
		typ, hasType := attr(1)
		dname, hasDName := attr(2)
		if !hasType || !hasDName || !c.m.data[typ+"."+dname] {
			c.report(rng, "data.%s.%s: no such data block in %s", typ, dname, c.m.dir)
		}
	case root == "path":
		if !slices.Contains([]string{"module", "root", "cwd"}, name) {
			c.report(rng, "path.%s: want path.module, path.root or path.cwd", name)
		}
	case root == "terraform":
	case root == "count":
		if !sc.count {
			c.report(rng, "count.%s outside a block with count", name)
		}
	case root == "each":
		if !sc.forEach {
			c.report(rng, "each.%s outside a block with for_each", name)
		}
	case root == "self":
		if !sc.self {
			c.report(rng, "self outside a resource")
		}
	default:
		if !hasName || !c.m.resources[root+"."+name] {
			c.report(rng, "%s: no resource %q %q in %s", traversalString(t), root, name, c.m.dir)
		}
	}
}

// fileCall checks the path of file(), filebase64() and templatefile(), and
// a template's variables against the ones templatefile() passes.
func (c *checker) fileCall(call *hclsyntax.FunctionCallExpr) {
	switch call.Name {
	case "file", "filebase64", "templatefile":
	default:
		return
	}
	if len(call.Args) == 0 {
		return
	}
	moduleDir, err := filepath.Abs(c.m.dir)
	if err != nil {
		return
	}
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{
		"path": cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal(moduleDir)}),
	}}
	v, diags := call.Args[0].Value(ctx)
	if diags.HasErrors() || !v.IsKnown() || v.IsNull() || v.Type() != cty.String {
		return // depends on more than path.module: cannot be checked statically
	}
	path := v.AsString()
	if !filepath.IsAbs(path) {
		// Terraform resolves relative paths against the working directory,
		// which is the module's own for the root modules here.
		path = filepath.Join(c.m.dir, path)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		c.report(call.Args[0].Range(), "%s(): %s does not exist", call.Name, path)
		return
	}
	if call.Name != "templatefile" || len(call.Args) < 2 {
		return
	}
	obj, ok := call.Args[1].(*hclsyntax.ObjectConsExpr)
	if !ok {
		return // variables built elsewhere: not checked
	}
	passed := map[string]bool{}
	for _, item := range obj.Items {
		key, ok := staticString(item.KeyExpr)
		if !ok {
			return
		}
		passed[key] = true
	}
	tmpl, tdiags := hclsyntax.ParseTemplate(src, path, hcl.InitialPos)
	if tdiags.HasErrors() {
		for _, d := range tdiags {
			c.problems = append(c.problems, diagString(d))
		}
		return
	}
	for _, t := range hclsyntax.Variables(tmpl) {
		if !passed[t.RootName()] {
			c.problems = append(c.problems, at(t.SourceRange(), "template variable %q is not passed by templatefile() at %s", t.RootName(), rangeString(call.Range())))
		}
	}
}

// staticString is the value of a literal string expression, or of a bare
// identifier (an object key written without quotes).
func staticString(e hclsyntax.Expression) (string, bool) {
	if k, ok := e.(*hclsyntax.ObjectConsKeyExpr); ok {
		if name := hcl.ExprAsKeyword(k.Wrapped); name != "" {
			return name, true
		}
		e = k.Wrapped
	}
	v, diags := e.Value(nil)
	if diags.HasErrors() || !v.IsKnown() || v.IsNull() || v.Type() != cty.String {
		return "", false
	}
	return v.AsString(), true
}

func traversalString(t hcl.Traversal) string {
	var b strings.Builder
	for i, step := range t {
		switch s := step.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			b.WriteString("[…]")
		case hcl.TraverseSplat:
			b.WriteString("[*]")
		default:
			if i > 0 {
				b.WriteString("…")
			}
		}
	}
	return b.String()
}

func rangeString(r hcl.Range) string { return fmt.Sprintf("%s:%d", r.Filename, r.Start.Line) }

func at(r hcl.Range, format string, args ...any) string {
	return rangeString(r) + ": " + fmt.Sprintf(format, args...)
}

func diagString(d *hcl.Diagnostic) string {
	if d.Subject != nil {
		return at(*d.Subject, "%s: %s", d.Summary, d.Detail)
	}
	return d.Summary + ": " + d.Detail
}
