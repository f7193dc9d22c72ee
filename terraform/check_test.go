package terraform

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestModules checks every module under terraform/ (this directory).
func TestModules(t *testing.T) {
	modules, problems, err := CheckTree(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"local", "aws", filepath.Join("aws", "modules", "region"), filepath.Join("aws", "modules", "peering")} {
		found := false
		for _, m := range modules {
			found = found || m == want
		}
		if !found {
			t.Errorf("module %s not checked (checked: %v)", want, modules)
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// writeModule writes files (path relative to a fresh directory: content)
// and returns the directory.
func writeModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A module that uses every construct the checker must understand, with no
// broken reference: the base the negative cases below break one at a time.
const goodModule = `
terraform {
  required_providers {
    aws = {
      source                = "hashicorp/aws"
      configuration_aliases = [aws.other]
    }
  }
}

provider "aws" {
  alias  = "r0"
  region = var.region
}

variable "region" {
  type = string
  validation {
    condition     = length(var.region) > 0
    error_message = "region: not empty."
  }
}

variable "names" {
  type    = list(object({ name = string, port = number }))
  default = []
}

locals {
  ports   = { for n in var.names : n.name => n.port }
  doubled = [for k, v in local.ports : v * 2 if k != ""]
  rendered = templatefile("${path.module}/t.tftpl", { items = local.doubled, title = "x" })
}

data "aws_ami" "base" {
  provider = aws.r0
}

resource "aws_instance" "node" {
  provider  = aws.other
  count     = 2
  ami       = data.aws_ami.base.id
  user_data = "${local.rendered}${count.index}"
  tags      = { Name = "n${count.index}" }

  dynamic "ebs_block_device" {
    for_each = local.ports
    iterator = dev
    content {
      device_name = dev.key
      volume_size = dev.value
    }
  }

  lifecycle {
    ignore_changes = [ami, tags]
    precondition {
      condition     = self == null || length(local.ports) >= 0
      error_message = "never"
    }
  }

  provisioner "local-exec" {
    command = self.id
    when    = destroy
  }
}

resource "terraform_data" "each" {
  for_each   = local.ports
  input      = "${each.key}=${each.value} ${aws_instance.node[0].id} ${path.root}"
  depends_on = [aws_instance.node]
}

module "child" {
  source    = "./child"
  providers = { aws = aws.r0 }
  ids       = aws_instance.node[*].id
}

output "child" {
  value = module.child.joined
}

output "each" {
  value = { for k, v in terraform_data.each : k => v.output }
}
`

const goodChild = `
variable "ids" {
  type = list(string)
}

variable "sep" {
  type    = string
  default = ","
}

output "joined" {
  value = join(var.sep, var.ids)
}
`

// childAliases makes the child require a provider configuration that the
// good module does not pass.
const childAliases = `
terraform {
  required_providers {
    aws = {
      source                = "hashicorp/aws"
      configuration_aliases = [aws.west]
    }
  }
}
`

const goodTemplate = "%{ for i in items ~}\n${title}-${i}\n%{ endfor ~}\n"

func TestCheckGoodModule(t *testing.T) {
	dir := writeModule(t, map[string]string{"main.tf": goodModule, "t.tftpl": goodTemplate, "child/main.tf": goodChild})
	problems, err := CheckModule(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("unexpected problem: %s", p)
	}
}

// TestCheckBrokenReferences breaks the good module one way at a time and
// wants exactly the matching problem.
func TestCheckBrokenReferences(t *testing.T) {
	for _, tc := range []struct {
		name      string
		old, new  string            // replaced in goodModule
		files     map[string]string // added to the good module's files
		wantMatch string
	}{
		{name: "undeclared variable", old: "region = var.region", new: "region = var.regoin", wantMatch: "var.regoin is not declared"},
		{name: "unused variable", old: `variable "names" {`, new: "variable \"unused\" {\n  type = string\n}\n\nvariable \"names\" {", wantMatch: `variable "unused" is declared but never used`},
		{name: "undeclared local", old: "for k, v in local.ports", new: "for k, v in local.port", wantMatch: "local.port is not declared"},
		{name: "missing resource", old: "${aws_instance.node[0].id}", new: "${aws_instance.nodes[0].id}", wantMatch: `no resource "aws_instance" "nodes"`},
		{name: "missing data", old: "data.aws_ami.base.id", new: "data.aws_ami.ubuntu.id", wantMatch: "data.aws_ami.ubuntu: no such data block"},
		{name: "missing resource in depends_on", old: "depends_on = [aws_instance.node]", new: "depends_on = [aws_instance.gone]", wantMatch: `no resource "aws_instance" "gone"`},
		{name: "missing module", old: "module.child.joined", new: "module.kid.joined", wantMatch: `module.kid: no module "kid"`},
		{name: "missing module output", old: "module.child.joined", new: "module.child.concatenated", wantMatch: `has no output "concatenated"`},
		{name: "undeclared module argument", old: "ids       = aws_instance.node[*].id", new: "ids = aws_instance.node[*].id\n  extra = 1", wantMatch: `has no variable "extra"`},
		{name: "required module argument missing", old: "ids       = aws_instance.node[*].id", new: "", wantMatch: `required variable "ids"`},
		{name: "missing template", old: "/t.tftpl", new: "/missing.tftpl", wantMatch: "missing.tftpl does not exist"},
		{name: "template variable not passed", old: `title = "x"`, new: `titel = "x"`, wantMatch: `template variable "title" is not passed`},
		{name: "output references a missing local", old: "value = module.child.joined", new: "value = local.nothing", wantMatch: "local.nothing is not declared"},
		{name: "output references a missing resource", old: "for k, v in terraform_data.each :", new: "for k, v in terraform_data.every :", wantMatch: `no resource "terraform_data" "every"`},
		{name: "count without count", old: "count     = 2", new: "", wantMatch: "count.index outside a block with count"},
		{name: "each without for_each", old: "for_each   = local.ports", new: "", wantMatch: "each.key outside a block with for_each"},
		{name: "unknown provider alias", old: "provider = aws.r0", new: "provider = aws.r1", wantMatch: "provider aws.r1 is not configured"},
		{name: "dynamic iterator out of scope", old: "volume_size = dev.value", new: "volume_size = dev.value\n    }\n  }\n  dynamic \"x\" {\n    for_each = []\n    content {\n      y = dev.value", wantMatch: `dev.value: no resource "dev" "value"`},
		{name: "configuration alias not passed", old: "providers = { aws = aws.r0 }", new: "providers = { aws = aws.r0 }", files: map[string]string{"child/versions.tf": childAliases}, wantMatch: "provider aws.west (configuration_aliases of"},
		{name: "syntax error", old: "value = module.child.joined", new: "value = module.child.joined +", wantMatch: "main.tf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(goodModule, tc.old) {
				t.Fatalf("goodModule does not contain %q", tc.old)
			}
			src := strings.Replace(goodModule, tc.old, tc.new, 1)
			files := map[string]string{"main.tf": src, "t.tftpl": goodTemplate, "child/main.tf": goodChild}
			for name, content := range tc.files {
				files[name] = content
			}
			dir := writeModule(t, files)
			problems, err := CheckModule(dir)
			if err != nil {
				t.Fatal(err)
			}
			matched := false
			for _, p := range problems {
				matched = matched || strings.Contains(p, tc.wantMatch)
			}
			if !matched {
				t.Errorf("want a problem matching %q, got %q", tc.wantMatch, problems)
			}
		})
	}
}

// terraformBinary is terraform from PATH, else the one `make terraform`
// installs into .bin; "" when there is none.
func terraformBinary() string {
	if p, err := exec.LookPath("terraform"); err == nil {
		return p
	}
	if p, err := filepath.Abs("../.bin/terraform"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func TestFormatted(t *testing.T) {
	tf := terraformBinary()
	if tf == "" {
		t.Skip("terraform is not installed (make terraform installs it): terraform fmt -check not run")
	}
	out, err := exec.Command(tf, "fmt", "-check", "-recursive", "-diff", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("terraform fmt -check -recursive terraform/: %v\n%s(make tf-fmt rewrites them)", err, out)
	}
}
