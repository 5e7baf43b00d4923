package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// nodeHost runs the Node host package's round-trip benchmark
// (clients/node/bench/roundtrip.mjs) against a serve built from this
// checkout, beside bare nats.js on the same server, and adds its rows. It
// needs node and the package built (npm --prefix clients/node ci, then
// npm --prefix clients/node run build); without them it says so and adds
// nothing.
func (r *runner) nodeHost() error {
	script := filepath.Join("clients", "node", "bench", "roundtrip.mjs")
	if _, err := exec.LookPath("node"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: node: skipped, no node on PATH")
		return nil
	}
	if _, err := os.Stat(filepath.Join("clients", "node", "dist", "index.js")); err != nil {
		fmt.Fprintln(os.Stderr, "bench: node: skipped, the package is not built (npm --prefix clients/node ci && npm --prefix clients/node run build)")
		return nil
	}
	bin, cleanup, err := buildServe()
	if err != nil {
		return err
	}
	defer cleanup()
	n := "2000"
	if r.quick {
		n = "300"
	}
	fmt.Fprintf(os.Stderr, "bench: %-12s %s\n", "node", "round trips from the Node host and bare nats.js")
	cmd := exec.Command("node", script, "--json", "--binary", bin, "--n", n)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("node benchmark: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var res Result
		if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
			return fmt.Errorf("node benchmark: a bad line %q: %w", sc.Text(), err)
		}
		r.add(res)
	}
	return sc.Err()
}
