package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// under containerd's own CNI timeout
const forwardTimeout = 40 * time.Second

// unreachable: the server was not there to do the call (no socket, nobody
// listening, or it went away before answering).
type unreachable struct{ err error }

func (u *unreachable) Error() string { return u.err.Error() }

type answer struct {
	Result json.RawMessage `json:"result"`
	Error  *cniError       `json:"error"`
}

// forward sends {"env": CNI_*, "conf": <stdin>} as one JSON line and reads
// the server's one-line answer (dra_driver/net/handoff/server.py).
func forward(socket string, env map[string]string, conf []byte) (json.RawMessage, error) {
	request, err := json.Marshal(map[string]any{"env": env, "conf": json.RawMessage(conf)})
	if err != nil {
		return nil, &cniError{codeBadConfig, fmt.Sprintf("%s: %v", pluginType, err)}
	}
	c, err := net.DialTimeout("unix", socket, forwardTimeout)
	if err != nil {
		return nil, &unreachable{err}
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(forwardTimeout))
	if _, err := c.Write(append(request, '\n')); err != nil {
		return nil, &unreachable{err}
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		// The server may have done part of the call: every step is
		// idempotent and journalled, so the retry (or its start-up repair)
		// finishes or undoes it.
		return nil, &unreachable{fmt.Errorf("no answer: %w", err)}
	}
	var a answer
	if err := json.Unmarshal(line, &a); err != nil {
		return nil, &cniError{codeUnexpected, fmt.Sprintf("%s: the hand-off server's answer is not JSON: %v", pluginType, err)}
	}
	if a.Error != nil {
		return nil, a.Error
	}
	if len(a.Result) == 0 || string(a.Result) == "null" {
		return nil, nil
	}
	return a.Result, nil
}

// recordMentions: whether any hand-off record may be for this pod (its UID
// appears in the file; the server reads them properly).
func recordMentions(stateDir, podUID string) (bool, error) {
	if podUID == "" {
		return false, nil
	}
	files, err := filepath.Glob(filepath.Join(stateDir, "*.json"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return false, err
		}
		if strings.Contains(string(body), podUID) {
			return true, nil
		}
	}
	return false, nil
}

// journalHolds: the host interfaces the mover's journal has in (or on their
// way to or from) this sandbox. An unreadable entry counts as held: only
// the driver can tell where that interface is.
func journalHolds(journalDir, sandbox string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(journalDir, "*.json"))
	if err != nil {
		return nil, err
	}
	var held []string
	for _, f := range files {
		body, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		var doc struct {
			Entry struct {
				HostIfName string `json:"hostIfName"`
				Sandbox    string `json:"sandbox"`
			} `json:"entry"`
		}
		if err != nil || json.Unmarshal(body, &doc) != nil {
			held = append(held, filepath.Base(f)+" (unreadable)")
		} else if doc.Entry.Sandbox == sandbox {
			held = append(held, doc.Entry.HostIfName)
		}
	}
	return held, nil
}
