// Command toposerve-nic is the NIC hand-off's CNI plugin (spec 1.0.0) as
// containerd execs it: it forwards ADD, DEL and CHECK to the NIC driver's
// resident hand-off server over its unix socket and passes the answer
// through. It moves nothing itself, so a node needs no Python for it.
//
// When the server does not answer it decides only what it can decide
// safely from the files the driver keeps: an ADD for a pod that no
// hand-off record mentions passes the previous result on (a pod without
// NICs must start while the driver restarts); a DEL or CHECK for a sandbox
// the journal has nothing of succeeds. Anything else fails with a CNI error
// naming the socket, and the runtime retries it.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

const (
	cniVersion = "1.0.0"
	pluginType = "toposerve-nic"
	// the driver's defaults (dra_driver/net/handoff/cni.py; a test holds them equal)
	defaultStateDir   = "/var/lib/kubelet/plugins/net.toposerve.io/handoff"
	defaultJournalDir = "/var/lib/kubelet/plugins/net.toposerve.io/journal"
	defaultSocket     = "/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock"
)

var supported = []string{"0.4.0", "1.0.0"}

// CNI's well-known error codes
const (
	codeBadEnv     = 4
	codeBadConfig  = 6
	codeTryAgain   = 11
	codeUnexpected = 999
)

type cniError struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

func (e *cniError) Error() string { return e.Msg }

// netConf is the part of the network config this binary reads; the whole
// document is forwarded as it came.
type netConf struct {
	CNIVersion   string          `json:"cniVersion"`
	StateDir     string          `json:"stateDir"`
	JournalDir   string          `json:"journalDir"`
	ServerSocket string          `json:"serverSocket"`
	PrevResult   json.RawMessage `json:"prevResult"`
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// cniArgs parses CNI_ARGS: K=V pairs separated by ';'.
func cniArgs(raw string) map[string]string {
	out := map[string]string{}
	for _, p := range strings.Split(raw, ";") {
		if k, v, ok := strings.Cut(p, "="); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// cniEnv is the CNI_* part of the environment, as the server's cni.run reads it.
func cniEnv(environ []string) map[string]string {
	out := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "CNI_") {
			out[k] = v
		}
	}
	return out
}

// call does one CNI call and returns what goes to stdout (nil: nothing).
func call(env map[string]string, stdin []byte) (json.RawMessage, error) {
	command := env["CNI_COMMAND"]
	if command == "VERSION" {
		return json.Marshal(map[string]any{"cniVersion": cniVersion, "supportedVersions": supported})
	}
	var conf netConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, &cniError{codeBadConfig, fmt.Sprintf("%s: network config on stdin is not JSON: %v", pluginType, err)}
	}
	switch command {
	case "ADD", "DEL", "CHECK":
	default:
		return nil, &cniError{codeBadEnv, fmt.Sprintf("%s: unknown CNI_COMMAND %q", pluginType, command)}
	}
	cid := env["CNI_CONTAINERID"]
	if cid == "" {
		return nil, &cniError{codeBadEnv, "CNI_CONTAINERID is not set"}
	}
	if command == "ADD" && env["CNI_NETNS"] == "" {
		return nil, &cniError{codeBadEnv, "CNI_NETNS is not set"}
	}
	socket := orDefault(conf.ServerSocket, defaultSocket)
	result, err := forward(socket, env, stdin)
	if _, down := err.(*unreachable); !down {
		return result, err
	}
	return fallback(command, cid, env, conf, err)
}

// fallback decides a call the server did not answer, from the driver's files.
func fallback(command, cid string, env map[string]string, conf netConf, why error) (json.RawMessage, error) {
	tryAgain := func(what string) error {
		return &cniError{codeTryAgain, fmt.Sprintf("%s: %s, and the NIC driver's hand-off server "+
			"does not answer on %s (%v): is `toposerve driver net` running on this node?",
			pluginType, what, orDefault(conf.ServerSocket, defaultSocket), why)}
	}
	journal := orDefault(conf.JournalDir, defaultJournalDir)
	switch command {
	case "ADD":
		uid := cniArgs(env["CNI_ARGS"])["K8S_POD_UID"]
		mentioned, err := recordMentions(orDefault(conf.StateDir, defaultStateDir), uid)
		if err != nil {
			return nil, tryAgain(err.Error())
		}
		if mentioned {
			return nil, tryAgain(fmt.Sprintf("pod %s has NICs to move in", uid))
		}
		return passedOn(conf)
	default: // DEL, CHECK
		held, err := journalHolds(journal, cid)
		if err != nil {
			return nil, tryAgain(err.Error())
		}
		if len(held) > 0 {
			return nil, tryAgain(fmt.Sprintf("sandbox %s holds %s", cid, strings.Join(held, ", ")))
		}
		return nil, nil
	}
}

// passedOn is the previous plugin's result unchanged but for the version
// (what the server answers for a pod without NICs).
func passedOn(conf netConf) (json.RawMessage, error) {
	out := map[string]any{}
	if len(conf.PrevResult) > 0 && string(conf.PrevResult) != "null" {
		if err := json.Unmarshal(conf.PrevResult, &out); err != nil {
			return nil, &cniError{codeBadConfig, fmt.Sprintf("%s: prevResult is not an object: %v", pluginType, err)}
		}
	}
	out["cniVersion"] = orDefault(conf.CNIVersion, cniVersion)
	for key, empty := range map[string]any{"interfaces": []any{}, "ips": []any{}, "routes": []any{}, "dns": map[string]any{}} {
		if out[key] == nil {
			out[key] = empty
		}
	}
	return json.Marshal(out)
}

func main() {
	var stdin []byte
	if os.Getenv("CNI_COMMAND") != "VERSION" {
		var err error
		if stdin, err = io.ReadAll(os.Stdin); err != nil {
			fail(&cniError{codeBadConfig, fmt.Sprintf("%s: reading stdin: %v", pluginType, err)})
		}
	}
	out, err := call(cniEnv(os.Environ()), stdin)
	if err != nil {
		fail(err)
	}
	if out != nil {
		os.Stdout.Write(out)
	}
}

func fail(err error) {
	e, ok := err.(*cniError)
	if !ok {
		e = &cniError{codeUnexpected, fmt.Sprintf("%s: %v", pluginType, err)}
	}
	body, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "code": e.Code, "msg": e.Msg})
	os.Stdout.Write(body)
	os.Exit(1)
}
