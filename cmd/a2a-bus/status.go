package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/wire"
)

// readStatus reads the broker's info and every page of its admin lists.
func readStatus(ctx context.Context, c *natsbus.Client, info *wire.AdminInfo, agents *[]wire.AgentCard, tasks *[]wire.AdminTask, sessions *[]wire.AdminSession) error {
	if err := hostCall(ctx, c, wire.MethodAdminInfo, info); err != nil {
		return err
	}
	err := hostList(ctx, c, wire.MethodAdminAgents, func(raw json.RawMessage) (string, error) {
		var page wire.AdminAgents
		err := json.Unmarshal(raw, &page)
		*agents = append(*agents, page.Agents...)
		return page.NextPageToken, err
	})
	if err != nil {
		return err
	}
	err = hostList(ctx, c, wire.MethodAdminTasks, func(raw json.RawMessage) (string, error) {
		var page wire.AdminTasks
		err := json.Unmarshal(raw, &page)
		*tasks = append(*tasks, page.Open...)
		return page.NextPageToken, err
	})
	if err != nil {
		return err
	}
	return hostList(ctx, c, wire.MethodAdminSessions, func(raw json.RawMessage) (string, error) {
		var page wire.AdminSessions
		err := json.Unmarshal(raw, &page)
		*sessions = append(*sessions, page.Sessions...)
		return page.NextPageToken, err
	})
}

func runStatus(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var h hostFlags
	h.register(fs)
	asJSON := fs.Bool("json", false, "print one JSON object instead of tables")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: a2a-bus status [flags]

Shows what a running broker is doing: its live agents with their
sessions, its open tasks, and per session the last seq, the events kept
for replay and the subscribers. It finds the broker through its
connection file.

Examples:
  a2a-bus status
  a2a-bus status --json | jq '.agents[].agentId'
  a2a-bus status --connection-file /run/user/1000/a2a-bus/connection.json

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return report(stderr, "status", err)
	}
	c, ref, err := h.dial()
	if err != nil {
		return report(stderr, "status", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := brokerStatus{UIURL: ref.ui}
	if err := readStatus(ctx, c, &st.Info, &st.Agents, &st.Tasks, &st.Sessions); err != nil {
		return report(stderr, "status", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
		return exitOK
	}
	printStatus(stdout, ref, &st)
	return exitOK
}

// brokerStatus is what status shows, and its --json form.
type brokerStatus struct {
	Info     wire.AdminInfo      `json:"info"`
	Agents   []wire.AgentCard    `json:"agents"`
	Tasks    []wire.AdminTask    `json:"openTasks"`
	Sessions []wire.AdminSession `json:"sessions"`
	// UIURL is the live view's address, from the connection file (serve
	// --ui); open it with "#token=" and the file's uiToken.
	UIURL string `json:"uiUrl,omitempty"`
}

// printStatus writes the status as a summary and three tables: agents,
// open tasks, sessions.
func printStatus(w io.Writer, ref brokerRef, st *brokerStatus) {
	i := st.Info
	fmt.Fprintf(w, "broker %s  bus %s  epoch %s  up %s  version %s\n", ref.url, i.Bus, short(i.Epoch), time.Duration(i.UptimeSeconds*float64(time.Second)).Round(time.Second), i.Version)
	fmt.Fprintf(w, "%d agents in %d sessions, %d open tasks\n", i.Agents, i.Sessions, i.OpenTasks)
	if st.UIURL != "" {
		fmt.Fprintf(w, "live view %s (add #token= and the connection file's uiToken)\n", st.UIURL)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nAGENT\tSESSION\tNAME\tREGISTERED")
	for _, a := range st.Agents {
		at := ""
		if a.RegisteredAt != nil {
			at = a.RegisteredAt.Format(time.DateTime)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.AgentID, a.ContextID, a.Name, at)
	}
	fmt.Fprintln(tw, "\nOPEN TASK\tSTATE\tREQUESTER\tSESSION\tASSIGNEE\tSESSION\tUPDATED")
	for _, t := range st.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(t.ID), t.State, t.RequesterName, t.ContextID, t.AgentName, t.AgentContextID, t.UpdatedAt.Format(time.DateTime))
	}
	fmt.Fprintln(tw, "\nSESSION\tAGENTS\tLAST SEQ\tKEPT\tSUBSCRIBERS")
	slices.SortFunc(st.Sessions, func(a, b wire.AdminSession) int { return strings.Compare(a.ContextID, b.ContextID) })
	for _, s := range st.Sessions {
		subs := "?"
		if s.Subscribers != nil {
			subs = fmt.Sprint(*s.Subscribers)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", s.ContextID, s.Agents, s.LastSeq, s.Kept, subs)
	}
	tw.Flush()
}
