package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// errUsage marks an error that is the user's input: exit status 2.
var errUsage = errors.New("usage")

// usageErrorf returns an error that exits 2 with its text.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// parseFlags parses args, then fills every flag the command line did not
// set from the --config file (a JSON object whose keys are the flag names
// without dashes). An unknown key or a bad value is a usage error naming
// the key. Warnings go to the flag set's output.
//
// Parse errors are returned, not printed: the caller reports them on one
// line. --help prints the usage to the flag set's output and returns
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, configFlag *string) error {
	_, err := parseFlagsFrom(fs, args, configFlag, fs.Output())
	return err
}

// origin says where a flag's value came from.
type origin uint8

const (
	fromDefault origin = iota
	fromFile
	fromEnv
	fromFlag
)

// parseFlagsFrom is parseFlags that also says where each value set came
// from, and writes its warnings to warn: serve holds them back until its
// first line, the connection file's path, is out.
func parseFlagsFrom(fs *flag.FlagSet, args []string, configFlag *string, warn io.Writer) (map[string]origin, error) {
	origins := map[string]origin{}
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.Usage()
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v (see a2a-bus help %s)", errUsage, err, fs.Name())
	}
	if fs.NArg() > 0 {
		return nil, usageErrorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		origins[f.Name] = fromFlag
	})
	if configFlag == nil {
		return origins, nil
	}
	// Flags win over the environment, which wins over the file.
	if err := applyEnv(fs, set, origins, warn); err != nil {
		return nil, err
	}
	if *configFlag == "" {
		return origins, nil
	}
	data, err := os.ReadFile(*configFlag)
	if err != nil {
		return nil, usageErrorf("config: %v", err)
	}
	return origins, applyConfig(fs, *configFlag, data, set, origins)
}

// envPrefix starts the environment variables that set flags:
// A2A_BUS_MAX_TASKS_PER_CONTEXT sets --max-tasks-per-context.
const envPrefix = "A2A_BUS_"

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets the flags not set on the command line from A2A_BUS_*
// variables, and marks them set so that the config file does not
// override them. An A2A_BUS_ variable that names no flag is ignored with
// a warning line on warn, not refused: the prefix is shared with hosts,
// which set their own (A2A_BUS_BIN naming the binary), and those must
// not stop the broker. A bad value of a known variable is an error.
func applyEnv(fs *flag.FlagSet, set map[string]bool, origins map[string]origin, warn io.Writer) error {
	known := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "print-config" {
			known[envName(f.Name)] = f
		}
	})
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || value == "" {
			continue // an empty variable counts as unset
		}
		f := known[name]
		if f == nil {
			fmt.Fprintf(warn, "a2a-bus %s: warning: environment variable %s names no setting; ignored\n", fs.Name(), name)
			continue
		}
		if set[f.Name] {
			continue
		}
		if err := fs.Set(f.Name, value); err != nil {
			return usageErrorf("environment: %s: bad value %q: %v", name, value, err)
		}
		set[f.Name] = true
		origins[f.Name] = fromEnv
	}
	return nil
}

func applyConfig(fs *flag.FlagSet, path string, data []byte, set map[string]bool, origins map[string]origin) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return usageErrorf("config %s: not a JSON object: %v", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return usageErrorf("config %s: trailing data after the JSON object", path)
	}
	for key, v := range obj {
		f := fs.Lookup(key)
		if f == nil || key == "config" || key == "print-config" {
			return usageErrorf("config %s: unknown key %q", path, key)
		}
		if set[key] {
			continue // flags win
		}
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case json.Number:
			s = v.String()
		case bool:
			s = fmt.Sprint(v)
		default:
			return usageErrorf("config %s: key %q: want a string, number or boolean", path, key)
		}
		if err := fs.Set(key, s); err != nil {
			return usageErrorf("config %s: key %q: bad value %q: %v", path, key, s, err)
		}
		origins[key] = fromFile
	}
	return nil
}

// newLogger returns the text logger on stderr at a level.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, usageErrorf("--log-level: %q is not debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// report prints a failure as one line and returns its exit status.
func report(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "a2a-bus %s: %s\n", cmd, strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		return exitUsage
	}
	fmt.Fprintf(stderr, "a2a-bus %s: %v\n", cmd, err)
	return exitFailure
}
