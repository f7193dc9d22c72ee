package cli

import (
	"strings"

	"github.com/geolog/geolog/client"
)

// errorHint is what to do next after a command failed with err, in plain
// words, or "" when the message says all there is.
func (e *env) errorHint(err error) string {
	if msg := err.Error(); strings.Contains(msg, "server preface") || strings.Contains(msg, "http2: frame too large") {
		// An HTTP/1 server answered the gRPC preface.
		return e.addr + " answers HTTP, not gRPC: is that a node's --debug-addr (metrics) or another service? Give the node's --listen address"
	}
	switch client.CodeOf(err) {
	case client.CodeUnavailable:
		return "is a geolog node listening at " + e.addr + "? " + e.tlsHint()
	case client.CodeStreamNotFound:
		return "'geolog streams list' shows the streams; 'geolog streams create NAME' makes one"
	case client.CodeStreamExists:
		return "'geolog streams describe NAME' shows it; 'geolog streams delete NAME' removes it"
	case client.CodeRangeNotFound:
		return "'geolog streams describe NAME' shows the stream's range count (ranges are numbered from 0)"
	case client.CodeRecordTooLarge, client.CodeBatchTooLarge:
		return "a record is at most the nodes' --record-bytes-max (1 MiB by default, key, value and headers together): split the value into several records, or raise --record-bytes-max on every node"
	case client.CodeOffsetOutOfRange:
		return "'geolog ranges STREAM' shows each range's start and tail offsets; --from start|end|TIME picks a position"
	case client.CodeUnauthenticated:
		return "give this tool a client certificate the nodes' CA signed (--certs-dir or GEOLOG_CERTS_DIR)"
	case client.CodePermissionDenied:
		return "the principal of this tool's certificate lacks the right; an operator grants it (docs/authz.md)"
	case client.CodeTimeout:
		return "--timeout bounds the whole command; the node may be overloaded or a region unreachable"
	case client.CodeOverloaded, client.CodeLimitExceeded:
		return "the node shed load or a quota was reached: retry later, or slower"
	case client.CodeGroupNotEmpty:
		return "stop the group's members first; 'geolog groups describe GROUP' lists them"
	case client.CodeGroupNotFound:
		return "'geolog groups list' shows the groups"
	case client.CodeNodeNotFound:
		return "'geolog nodes list' shows the region's nodes and their ids"
	case client.CodeNodeIDRetired:
		return "the node was decommissioned: its id is never reused nor its state changed; start a new node with a new --node-id"
	case client.CodeNodeIDInUse:
		return "another node holds this id at another address; a node changes its address only with its own certificate"
	case client.CodeAddressInUse:
		return "another node of the region listens at this address ('geolog nodes list')"
	case client.CodeRangeSplit:
		return "the range split already: 'geolog streams describe NAME' shows its children; split one of them"
	case client.CodeSplitInProgress:
		return "another split of the stream is under way: run the command again once it ends (asking again for that same split finishes it)"
	}
	return ""
}
