package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// completionScripts are what `geolog completion SHELL` prints. Each asks
// `geolog __complete WORDS...` for the candidates of the last (partial) word.
var completionScripts = map[string]string{
	"bash": `# geolog completion for bash: source <(geolog completion bash)
_geolog() {
	local IFS=$'\n'
	COMPREPLY=($(geolog __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o default -F _geolog geolog
`,
	"zsh": `#compdef geolog
# geolog completion for zsh: geolog completion zsh > "${fpath[1]}/_geolog"
_geolog() {
	local -a candidates
	candidates=("${(@f)$(geolog __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
	compadd -a candidates
}
compdef _geolog geolog
`,
	"fish": `# geolog completion for fish: geolog completion fish | source
complete -c geolog -f -a '(geolog __complete (commandline -opc)[2..-1] (commandline -ct))'
`,
}

// completion prints the completion script of a shell.
func (e *env) completion(args []string) error {
	if len(args) != 1 || completionScripts[args[0]] == "" {
		return usagef("usage: completion bash|zsh|fish")
	}
	fmt.Fprint(e.stdout, completionScripts[args[0]])
	return nil
}

// commandNames are the top-level commands, from the usage text.
func commandNames() []string {
	seen := map[string]bool{}
	var names []string
	for _, line := range strings.Split(usage, "\n") {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") || strings.HasPrefix(line, "  -") {
			continue
		}
		f := strings.Fields(line)
		if len(f) > 0 && !seen[f[0]] {
			seen[f[0]] = true
			names = append(names, f[0])
		}
	}
	sort.Strings(names)
	return names
}

// subcommandNames are cmd's subcommands, from its usage lines
// ("streams create ...", "keys list|rotate|rewrap ...").
func subcommandNames(cmd string) []string {
	seen := map[string]bool{}
	var names []string
	for _, line := range strings.Split(usageOf(cmd), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != cmd {
			continue
		}
		for _, s := range strings.Split(f[1], "|") {
			if s != "" && !strings.HasPrefix(s, "<") && !strings.HasPrefix(s, "[") && !strings.HasPrefix(s, "-") && !seen[s] {
				seen[s] = true
				names = append(names, s)
			}
		}
	}
	sort.Strings(names)
	return names
}

var flagLineRE = regexp.MustCompile(`(?m)^\s+-([A-Za-z0-9][A-Za-z0-9-]*)`)

// flagNames are the flags a command line takes, read from its --help.
func (e *env) flagNames(ctx context.Context, words []string) []string {
	var out bytes.Buffer
	Run(ctx, append(append([]string(nil), words...), "--help"), e.stdin, &out, &out)
	var names []string
	for _, m := range flagLineRE.FindAllStringSubmatch(out.String(), -1) {
		names = append(names, "--"+m[1])
	}
	sort.Strings(names)
	return names
}

// streamArg: the commands whose first argument is a stream's name.
var streamArg = map[string]bool{"produce": true, "consume": true, "ranges": true, "lag": true, "rehome": true,
	"streams describe": true, "streams delete": true, "orphans list": true, "orphans republish": true}

// complete prints the candidates for the last of words (the word being
// typed, maybe empty), one a line: commands, subcommands, flags, and stream
// names (asked of the node, within a second; none when it does not answer).
func (e *env) complete(ctx context.Context, words []string) error {
	if len(words) == 0 {
		words = []string{""}
	}
	cur, before := words[len(words)-1], words[:len(words)-1]
	var pos []string // the words that are not flags (nor a flag's value)
	for i := 0; i < len(before); i++ {
		if strings.HasPrefix(before[i], "-") {
			if !strings.Contains(before[i], "=") && i+1 < len(before) && !strings.HasPrefix(before[i+1], "-") && !boolFlag(before[i]) {
				i++
			}
			continue
		}
		pos = append(pos, before[i])
	}
	e.globalsFrom(before)
	var candidates []string
	switch {
	case strings.HasPrefix(cur, "-"):
		cmdWords := pos
		if len(cmdWords) > 2 {
			cmdWords = cmdWords[:2]
		}
		if len(cmdWords) == 0 {
			cmdWords = []string{"version"} // the global flags
		}
		candidates = e.flagNames(ctx, cmdWords)
	case len(pos) == 0:
		candidates = commandNames()
	case len(pos) == 1 && subcommanded[pos[0]]:
		candidates = subcommandNames(pos[0])
	case len(pos) == 1 && pos[0] == "help", len(pos) == 1 && pos[0] == "completion":
		if pos[0] == "help" {
			candidates = commandNames()
		} else {
			candidates = []string{"bash", "fish", "zsh"}
		}
	case len(pos) == 1 && streamArg[pos[0]], len(pos) == 2 && streamArg[pos[0]+" "+pos[1]]:
		candidates = e.streamNames(ctx)
	}
	for _, c := range candidates {
		if strings.HasPrefix(c, cur) {
			fmt.Fprintln(e.stdout, c)
		}
	}
	return nil
}

// globalsFrom applies the global flags among words (--addr, --context,
// the TLS files) to e, so that stream names are asked of the node the
// command line names; other words are ignored.
func (e *env) globalsFrom(words []string) {
	fs := e.flagSet("complete")
	fs.SetOutput(io.Discard)
	var globals []string
	for i := 0; i < len(words); i++ {
		name, _, hasVal := strings.Cut(strings.TrimLeft(words[i], "-"), "=")
		if !strings.HasPrefix(words[i], "-") || fs.Lookup(name) == nil {
			continue
		}
		globals = append(globals, words[i])
		if !hasVal && i+1 < len(words) {
			globals = append(globals, words[i+1])
			i++
		}
	}
	fs.Parse(globals)
}

// boolFlag reports whether a flag takes no value (then the next word is not
// its value).
func boolFlag(f string) bool {
	switch strings.TrimLeft(f, "-") {
	case "json", "follow", "v", "sync", "tab", "tombstones", "dry-run", "use", "overwrite", "to-earliest", "to-latest":
		return true
	}
	return false
}

// streamNames lists the streams, within a second, or none.
func (e *env) streamNames(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := e.client()
	if err != nil {
		return nil
	}
	defer c.Close()
	list, err := c.ListStreams(ctx)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(list))
	for _, s := range list {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}
