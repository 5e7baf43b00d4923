package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/internal/testbin"
	"github.com/a2a-bus/a2a-bus/natsbus"
	"github.com/a2a-bus/a2a-bus/runtime"
	"github.com/a2a-bus/a2a-bus/wire"
)

// The browser harness: web pages (as Electron's renderers are) that load
// the Node package's browser bundle (clients/node/dist/browser/a2a-bus.js,
// written by its build) in headless Chromium, against a real `a2a-bus
// serve --ws-listen`. A test server stands in for the app's main process:
// it serves the page and hands it session credentials, which it opens
// with the host credential (Host.sessionCredentials in a Node app).
//
//	b := startPageBroker(t)          // serve --ws-listen 127.0.0.1:0, on a data dir
//	p := openPage(t, b, "localhost") // http://localhost:PORT/, its own incognito context
//	var id string
//	p.eval(`const s = await bus.connectSession({contextId: "c", credentials: creds}); ...; return d.id`, &id)
//
// One Chromium serves every test (started on first use, stopped by
// TestMain); each page is a target of its own in a browser context of its
// own. Without Chromium or the bundle the tests skip, saying what to
// install or build; with REQUIRE_BROWSER_TESTS=1 (CI) they fail.

// evilHost resolves, in the shared Chromium only, to 127.0.0.1: a page
// served from it has an origin the broker does not allow.
const evilHost = "evil.example"

// browserTimeout bounds each step a page takes.
const browserTimeout = 60 * time.Second

// missing skips the test for a missing browser or bundle, or fails it
// when they are required.
func missing(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("REQUIRE_BROWSER_TESTS") == "1" {
		t.Fatalf("%s (REQUIRE_BROWSER_TESTS=1)", msg)
	}
	t.Skip(msg)
}

// nodeDir is the Node package's folder.
func nodeDir() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "clients", "node")
}

// pageBundle returns the path of the browser bundle, skipping the test
// when it has not been built.
func pageBundle(t *testing.T) string {
	t.Helper()
	p := filepath.Join(nodeDir(), "dist", "browser", "a2a-bus.js")
	if _, err := os.Stat(p); err != nil {
		missing(t, "no browser bundle at %s: build it with `npm --prefix clients/node ci && npm --prefix clients/node run build` (scripts/test does)", p)
	}
	return p
}

// chromium is the shared browser.
var chromium struct {
	once        sync.Once
	err         error
	ctx         context.Context
	stop, alloc context.CancelFunc
}

// theBrowser returns the shared Chromium's context, starting it on first
// use; it skips the test when there is no Chromium.
func theBrowser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		missing(t, "no Chromium on PATH: install it (Debian: apt-get install chromium)")
	}
	chromium.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path),
			chromedp.Flag("host-resolver-rules", "MAP "+evilHost+" 127.0.0.1"))
		if os.Geteuid() == 0 {
			opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses root
		}
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(alloc)
		chromium.ctx, chromium.alloc, chromium.stop = ctx, cancelAlloc, cancel
		chromium.err = chromedp.Do(ctx) // starts it
	})
	require.NoError(t, chromium.err, "starting Chromium (%s)", path)
	return chromium.ctx
}

// stopBrowser stops the shared Chromium, if it was started, and waits
// for it to exit.
func stopBrowser() {
	if chromium.stop == nil {
		return
	}
	ctx, cancel := context.WithTimeout(chromium.ctx, 10*time.Second)
	defer cancel()
	if err := chromedp.Cancel(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "stopping Chromium:", err)
	}
	chromium.stop()
	chromium.alloc()
}

// pageBroker is a real `a2a-bus serve --ws-listen 127.0.0.1:0` on a data
// dir of its own, which a test may kill and start again on it. Its host
// connection (the host token) stands in for an app's main process.
type pageBroker struct {
	t       *testing.T
	bin     string
	dir     string
	args    []string
	refused *lineLog // its log lines of pages refused for their origin

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	info struct {
		URL     string `json:"url"`
		Token   string `json:"token"`
		WSURL   string `json:"wsUrl"`
		UIURL   string `json:"uiUrl"`
		UIToken string `json:"uiToken"`
	}
	host *nats.Conn
}

func startPageBroker(t *testing.T, args ...string) *pageBroker {
	t.Helper()
	pageBundle(t) // what the pages need, before anything is started
	theBrowser(t)
	b := &pageBroker{t: t, bin: testbin.A2ABus(t), dir: t.TempDir(), args: args,
		refused: &lineLog{want: "websocket: refused a page"}}
	b.start()
	t.Cleanup(b.kill)
	return b
}

// start starts serve on the broker's data dir and joins it as the host.
func (b *pageBroker) start() {
	b.t.Helper()
	conn := filepath.Join(b.dir, "run", "connection.json")
	cmd := exec.Command(b.bin, append([]string{"serve", "--ws-listen", "127.0.0.1:0", "--connection-file", conn,
		"--data-dir", filepath.Join(b.dir, "data"), "--log-level", "info"}, b.args...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+b.dir, "XDG_STATE_HOME="+b.dir, "HOME="+b.dir)
	stderr, err := cmd.StderrPipe()
	require.NoError(b.t, err)
	require.NoError(b.t, cmd.Start())
	done := make(chan struct{})
	r := bufio.NewReader(stderr)
	first, err := r.ReadString('\n')
	go func() {
		io.Copy(b.refused, r)
		cmd.Wait()
		close(done)
	}()
	if err != nil {
		cmd.Process.Kill()
		<-done
		b.t.Fatalf("serve printed no connection file: %v", err)
	}
	data, err := os.ReadFile(strings.TrimSpace(first))
	require.NoError(b.t, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cmd, b.done = cmd, done
	require.NoError(b.t, json.Unmarshal(data, &b.info))
	require.NotEmpty(b.t, b.info.WSURL, "the connection file names the WebSocket listener")
	b.host, err = nats.Connect(b.info.URL, nats.Token(b.info.Token), nats.NoReconnect())
	require.NoError(b.t, err)
}

// kill kills the broker (SIGKILL) and waits for it. Idempotent.
func (b *pageBroker) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	b.host.Close()
	b.cmd.Process.Signal(syscall.SIGKILL)
	<-b.done
	b.cmd = nil
}

// restart kills the broker and starts it again on the same data dir: a
// new process, new ports, a new host token.
func (b *pageBroker) restart() {
	b.t.Helper()
	b.kill()
	b.start()
}

// wsURL is the current broker's WebSocket listener.
func (b *pageBroker) wsURL() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info.WSURL
}

// hostCall is a host-only request to the current broker.
func (b *pageBroker) hostCall(method string, params, result any) error {
	b.mu.Lock()
	host := b.host
	b.mu.Unlock()
	body, err := wire.EncodeRequest(uint64(rpcIDs.Add(1)), method, params)
	if err != nil {
		return err
	}
	msg, err := host.Request(natsbus.HostRPC, body, 10*time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	raw, err := wire.DecodeResult(msg.Data)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, result)
}

// credentials opens a new credential of the session, as an app's main
// process does for its page.
func (b *pageBroker) credentials(session string) (wire.SessionCredentials, error) {
	var creds wire.SessionCredentials
	err := b.hostCall(wire.MethodSessionOpen, wire.SessionParams{ContextID: session}, &creds)
	return creds, err
}

// runtime is a Go runtime of the session on the current broker, on a
// connection of its own with the host credential; closed when the test
// ends. After a restart, make another.
func (b *pageBroker) runtime(session string) *runtime.Runtime {
	b.t.Helper()
	b.mu.Lock()
	url, token := b.info.URL, b.info.Token
	b.mu.Unlock()
	c, err := natsbus.Dial(natsbus.ClientConfig{URL: url, Token: token, NoReconnect: true})
	require.NoError(b.t, err)
	b.t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	s, err := c.Session(ctx, session)
	require.NoError(b.t, err)
	rt, err := runtime.New(ctx, s, runtime.Config{Feed: runtime.FeedConfig{CheckInterval: 200 * time.Millisecond}})
	require.NoError(b.t, err)
	b.t.Cleanup(func() { rt.Close() })
	return rt
}

// lineLog is a process's output, discarded but for the lines that
// contain want, which it keeps.
type lineLog struct {
	want  string
	mu    sync.Mutex
	line  []byte
	lines []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for rest := p; len(rest) > 0; {
		i := strings.IndexByte(string(rest), '\n')
		if i < 0 {
			l.line = append(l.line, rest...)
			break
		}
		l.line = append(l.line, rest[:i]...)
		if strings.Contains(string(l.line), l.want) {
			l.lines = append(l.lines, string(l.line))
		}
		l.line, rest = l.line[:0], rest[i+1:]
	}
	return len(p), nil
}

func (l *lineLog) kept() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// testPage is one page in the shared Chromium, served by a test server
// that stands in for the app's main process.
type testPage struct {
	t      *testing.T
	ctx    context.Context
	origin string

	mu     sync.Mutex
	issued map[string][]wire.SessionCredentials // the credentials handed out, by session
}

// The page: it loads nothing itself; each eval imports the bundle.
const pageHTML = `<!doctype html><meta charset="utf-8"><title>a2a-bus page</title>`

// evalPrelude is what each eval's body has in scope: bus (the bundle's
// exports), creds (the credentials callback: asks the test server, as a
// renderer asks its main process over its preload bridge) and nats (a
// function that imports nats-core itself, for what the runtime never
// does).
const evalPrelude = `const bus = await import("/a2a-bus.js");
const creds = async (id) => {
  const r = await fetch("/credentials?session=" + encodeURIComponent(id));
  if (!r.ok) throw new Error("credentials: " + r.status + " " + (await r.text()));
  return r.json();
};
const nats = () => import("/nats-core.js");
`

// openPage serves the page on a test server and opens it in the shared
// Chromium from http://HOST:PORT/, in a browser context of its own (as
// incognito): host is "localhost", or evilHost for an origin the broker
// refuses.
func openPage(t *testing.T, b *pageBroker, host string) *testPage {
	t.Helper()
	bundle := pageBundle(t)
	browser := theBrowser(t)
	p := &testPage{t: t, issued: map[string][]wire.SessionCredentials{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, pageHTML)
	})
	mux.HandleFunc("GET /a2a-bus.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		http.ServeFile(w, r, bundle)
	})
	mux.HandleFunc("GET /nats-core.js", func(w http.ResponseWriter, r *http.Request) {
		code, err := natsCoreBundle()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/javascript")
		w.Write(code)
	})
	mux.HandleFunc("GET /credentials", func(w http.ResponseWriter, r *http.Request) {
		session := r.URL.Query().Get("session")
		creds, err := b.credentials(session)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		p.mu.Lock()
		p.issued[session] = append(p.issued[session], creds)
		p.mu.Unlock()
		json.NewEncoder(w).Encode(creds)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	p.origin = "http://" + net.JoinHostPort(host, port)

	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	p.ctx = ctx
	// The first run makes the target, which lives as long as the context
	// of that run: ctx, not one with a deadline.
	require.NoError(t, chromedp.Do(ctx), "opening a target")
	nav, done := context.WithTimeout(ctx, browserTimeout)
	defer done()
	require.NoError(t, chromedp.Do(nav, chromedp.Navigate(p.origin+"/")), "opening %s", p.origin)
	return p
}

// eval runs body, the body of an async function with evalPrelude in
// scope, in the page; its result, as JSON, goes into out (nil: none). A
// rejection is an error.
func (p *testPage) eval(body string, out any) error {
	ctx, cancel := context.WithTimeout(p.ctx, browserTimeout)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte]("(async () => {\n"+evalPrelude+body+"\n})()", chromedp.EvalAwaitPromise))
	if err != nil || out == nil {
		return err
	}
	return json.Unmarshal(raw, out)
}

// mustEval is eval that fails the test.
func (p *testPage) mustEval(body string, out any) {
	p.t.Helper()
	require.NoError(p.t, p.eval(body, out))
}

// credentialsIssued returns the credentials the page was handed for session.
func (p *testPage) credentialsIssued(session string) []wire.SessionCredentials {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]wire.SessionCredentials(nil), p.issued[session]...)
}

var natsCore struct {
	once sync.Once
	code []byte
	err  error
}

// natsCoreBundle is @nats-io/nats-core (the Node package's dependency) in
// one ES module for a page, bundled by the esbuild binary the package's
// build uses.
func natsCoreBundle() ([]byte, error) {
	natsCore.once.Do(func() {
		arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[goruntime.GOARCH]
		goos := map[string]string{"windows": "win32"}[goruntime.GOOS]
		if goos == "" {
			goos = goruntime.GOOS
		}
		exe := filepath.Join(nodeDir(), "node_modules", "@esbuild", goos+"-"+arch, "bin", "esbuild")
		if goos == "win32" {
			exe = filepath.Join(nodeDir(), "node_modules", "@esbuild", goos+"-"+arch, "esbuild.exe")
		}
		cmd := exec.Command(exe, "--bundle", "--format=esm", "--platform=browser", "--log-level=error")
		cmd.Dir = nodeDir()
		cmd.Stdin = strings.NewReader(`export { wsconnect } from "@nats-io/nats-core";`)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		natsCore.code, natsCore.err = cmd.Output()
		if natsCore.err != nil {
			natsCore.err = fmt.Errorf("%s: %w: %s", exe, natsCore.err, stderr.String())
		}
	})
	return natsCore.code, natsCore.err
}

// finalTask waits until d hears that the task is terminal, by an event
// or a resync, and returns it as it heard it.
func finalTask(t *testing.T, d *runtime.Delegate, taskID string) *wire.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	for {
		ev, err := d.Wait(ctx)
		require.NoError(t, err, "task %s never ended", taskID)
		if ev.Task != nil && ev.Task.TaskID == taskID && ev.Task.Final {
			return ev.Task.Task
		}
		if ev.Resync != nil {
			for _, task := range ev.Resync.Changed {
				if task.ID == taskID && task.Status.State.Terminal() {
					return task
				}
			}
		}
	}
}

// textOf is the text of a message's parts.
func textOf(m *wire.Message) string {
	if m == nil {
		return ""
	}
	var s []string
	for _, p := range m.Parts {
		if p.Text != nil {
			s = append(s, *p.Text)
		}
	}
	return strings.Join(s, " ")
}

// pageWorker is the body that connects the page's session and spawns
// its delegate, kept on window for later evals; it returns the
// delegate's id.
func pageWorker(session, name string) string {
	return fmt.Sprintf(`window.session = await bus.connectSession({contextId: %q, credentials: creds, checkMs: 500});
window.worker = await window.session.spawn({name: %q, description: "a delegate in a web page"});
return window.worker.id;`, session, name)
}

// liveView is the broker's live view (serve --ui) open in the shared
// Chromium, in a browser context of its own.
type liveView struct {
	t   *testing.T
	ctx context.Context
}

// openLiveView opens the live view at the address serve logs (the token
// in the fragment) and waits until it follows the broker's events.
func openLiveView(t *testing.T, b *pageBroker) *liveView {
	t.Helper()
	b.mu.Lock()
	addr := b.info.UIURL + "#token=" + b.info.UIToken
	b.mu.Unlock()
	require.NotEmpty(t, b.info.UIURL, "serve --ui names the live view in the connection file")
	ctx, cancel := chromedp.NewContext(theBrowser(t), chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	require.NoError(t, chromedp.Do(ctx), "opening a target")
	v := &liveView{t: t, ctx: ctx}
	v.run(chromedp.EmulateViewport(1280, 470), chromedp.Navigate(addr),
		chromedp.WaitVisible(chromedp.CSS(`#status[data-live="true"]`)))
	hash, err := chromedp.Run(v.timed(), chromedp.Evaluate[string](`location.hash`))
	require.NoError(t, err)
	require.Empty(t, hash, "the page takes the token out of the address bar")
	return v
}

func (v *liveView) run(steps ...chromedp.Action[chromedp.Void]) {
	v.t.Helper()
	require.NoError(v.t, chromedp.Do(v.timed(), steps...))
}

// timed is the view's context bounded by browserTimeout, until the test
// ends.
func (v *liveView) timed() context.Context {
	ctx, cancel := context.WithTimeout(v.ctx, browserTimeout)
	v.t.Cleanup(cancel)
	return ctx
}

// shows waits until the view has an element matching the CSS selector.
func (v *liveView) shows(selector string) {
	v.t.Helper()
	v.run(chromedp.WaitVisible(chromedp.CSS(selector)))
}

// screenshot saves what the view shows as a PNG in the test's temp dir,
// and also at A2A_BUS_LIVEVIEW_PNG when that is set (docs/liveview.png
// is made so).
func (v *liveView) screenshot() {
	v.t.Helper()
	png, err := chromedp.Run(v.timed(), chromedp.CaptureScreenshot())
	require.NoError(v.t, err)
	require.NoError(v.t, os.WriteFile(filepath.Join(v.t.TempDir(), "liveview.png"), png, 0o600))
	if dst := os.Getenv("A2A_BUS_LIVEVIEW_PNG"); dst != "" {
		require.NoError(v.t, os.WriteFile(dst, png, 0o644))
	}
}

// TestBrowserPageDelegateCompletesATask: a page connects over WebSocket
// with a session credential its host handed it, registers a delegate,
// takes a task a Go delegate of another session sends it, and completes
// it with a message and an artifact, which the Go side sees. The live
// view (serve --ui), open meanwhile, shows both sessions, their agents,
// the task reaching completed and another task still open.
func TestBrowserPageDelegateCompletesATask(t *testing.T) {
	b := startPageBroker(t, "--ui")
	view := openLiveView(t, b)
	p := openPage(t, b, "localhost")
	var id string
	p.mustEval(pageWorker("page-1", "page-worker"), &id)
	require.Equal(t, "page-worker", id)

	ctx := context.Background()
	asker, err := b.runtime("go-1").Spawn(ctx, wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	task, err := asker.Send(ctx, "page-worker", clusterText("add 2 and 3"), nil)
	require.NoError(t, err)

	var took struct{ TaskID, Text, From string }
	p.mustEval(`for (;;) {
  const ev = await window.worker.wait({signal: AbortSignal.timeout(30000)});
  if (ev.task?.kind !== "created") continue;
  const m = ev.task.message;
  await window.worker.update(ev.task.taskId, "completed", {
    message: bus.text("5"),
    artifacts: [{name: "sum", parts: [{kind: "text", text: "2 + 3 = 5"}]}],
  });
  return {taskId: ev.task.taskId, text: m.parts.map((p) => p.text).join(" "), from: m.from};
}`, &took)
	require.Equal(t, task.ID, took.TaskID)
	require.Equal(t, "add 2 and 3", took.Text)
	require.Equal(t, "asker", took.From)

	done := finalTask(t, asker, task.ID)
	require.Equal(t, wire.StateCompleted, done.Status.State)
	require.Equal(t, "5", textOf(done.Status.Message))
	require.Len(t, done.Artifacts, 1)
	require.Equal(t, "sum", done.Artifacts[0].Name)
	require.Equal(t, "2 + 3 = 5", textOf(&wire.Message{Parts: done.Artifacts[0].Parts}))
	require.Len(t, p.credentialsIssued("page-1"), 1, "one credential for one connection")

	// A second task stays open, for the view's open tasks.
	// Its text holds a bidi override, which the view shows as an escape.
	open, err := asker.Send(ctx, "page-worker", clusterText("and now 4 and 5?\u202e"), nil)
	require.NoError(t, err)
	view.shows(`section[data-context-id="page-1"] li[data-agent-id="page-worker"]`)
	view.shows(`section[data-context-id="go-1"] li[data-agent-id="asker"]`)
	view.shows(fmt.Sprintf(`#timeline li[data-task-id=%q][data-state="completed"]`, task.ID))
	view.shows(fmt.Sprintf(`#timeline li[data-task-id=%q][data-kind="created"]`, task.ID))
	view.shows(fmt.Sprintf(`#open-tasks tr[data-task-id=%q][data-state="submitted"]`, open.ID))
	row, err := chromedp.Run(view.timed(), chromedp.Evaluate[string](fmt.Sprintf(
		`document.querySelector('#timeline li[data-task-id=%q][data-kind="created"]').textContent`, open.ID)))
	require.NoError(t, err)
	assert.Contains(t, row, `and now 4 and 5?\u202e`, "the override shown as an escape")
	assert.NotContains(t, row, "\u202e", "not as itself")
	view.screenshot()
	p.mustEval(`await window.session.close(); return null`, nil)
}

// TestBrowserPageSessionSurvivesABrokerRestart: the broker is killed
// while a page's delegate is registered with a task waiting for it, and
// started again on the same data dir (new ports, new host token). The
// page's session gets a new credential from its callback, for the new
// listener, resyncs (its delegate registered again under its instance id,
// keeping its name), and completes both the task sent before the restart
// (the broker kept it: the runtime promises tasks the broker keeps are
// not lost, Resync.changed) and one sent after.
func TestBrowserPageSessionSurvivesABrokerRestart(t *testing.T) {
	b := startPageBroker(t)
	p := openPage(t, b, "localhost")
	var id string
	p.mustEval(pageWorker("page-1", "page-worker"), &id)
	ctx := context.Background()
	asker, err := b.runtime("go-1").Spawn(ctx, wire.AgentCard{Name: "asker"})
	require.NoError(t, err)
	before, err := asker.Send(ctx, "page-worker", clusterText("before"), nil)
	require.NoError(t, err)
	oldWS := b.wsURL()

	b.restart()
	require.NotEqual(t, oldWS, b.wsURL(), "the listener moved: the page can only follow with a new credential")
	// The asker's host is gone with its token: a new one, same instance.
	asker, err = b.runtime("go-1").SpawnInstance(ctx, wire.AgentCard{Name: "asker"}, asker.InstanceID())
	require.NoError(t, err)
	require.Equal(t, "asker", asker.ID())
	// The page's delegate registers again on its own once its session is
	// back (its resync): until then its name is unknown.
	var after *wire.Task
	require.True(t, poll(browserTimeout, 50*time.Millisecond, func() bool {
		after, err = asker.Send(ctx, "page-worker", clusterText("after"), nil)
		return !errors.Is(err, wire.ErrUnknownAgent)
	}), "the page's delegate never registered again")
	require.NoError(t, err)

	var seen struct {
		Completed []string
		Resyncs   []string
	}
	p.mustEval(fmt.Sprintf(`const want = new Set([%q, %q]);
const completed = [], resyncs = [];
const open = (t) => ["submitted", "working"].includes(t.status.state) && t.agentName === window.worker.id;
const complete = async (t) => {
  if (!want.has(t.id) || completed.includes(t.id)) return;
  await window.worker.update(t.id, "completed", {message: bus.text("done: " + t.id)});
  completed.push(t.id);
};
while (completed.length < want.size) {
  const ev = await window.worker.wait({signal: AbortSignal.timeout(30000)});
  if (ev.task?.kind === "created") await complete(ev.task.task);
  if (ev.resync) {
    resyncs.push(ev.resync.reason);
    for (const t of ev.resync.changed) if (open(t)) await complete(t);
  }
}
return {completed, resyncs};`, before.ID, after.ID), &seen)
	require.ElementsMatch(t, []string{before.ID, after.ID}, seen.Completed)
	require.NotEmpty(t, seen.Resyncs, "the page's delegate was told of the break")
	require.Contains(t, strings.Join(seen.Resyncs, "; "), "the broker restarted")

	for _, id := range []string{before.ID, after.ID} {
		done := finalTask(t, asker, id)
		require.Equal(t, wire.StateCompleted, done.Status.State, id)
		require.Equal(t, "done: "+id, textOf(done.Status.Message))
	}
	issued := p.credentialsIssued("page-1")
	require.GreaterOrEqual(t, len(issued), 2, "the callback was asked again after the restart")
	require.Equal(t, oldWS, issued[0].WSURL)
	require.Equal(t, b.wsURL(), issued[len(issued)-1].WSURL)
}

// TestBrowserPageFromAnotherOriginIsRefused: a page from an origin the
// broker does not allow (a web site's) cannot connect, even with a valid
// credential: connectSession rejects, the broker refused its upgrade
// (and said so), and no connection of the session was admitted; the same
// credential, from a program (no Origin), connects.
func TestBrowserPageFromAnotherOriginIsRefused(t *testing.T) {
	b := startPageBroker(t)
	// An agent of the session, registered over TCP by a connection that
	// subscribes to nothing, so that the broker lists the session and
	// counts the subscriptions to its events: the runtime's first act on
	// a connection is to subscribe.
	creds, err := b.credentials("evil-1")
	require.NoError(t, err)
	tcp, err := nats.Connect(creds.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("evil-1")))
	require.NoError(t, err)
	defer tcp.Close()
	_, err = call(t, tcp, natsbus.RPCSubject("evil-1"), natsbus.SessionInbox("evil-1"), wire.MethodRegister,
		wire.RegisterParams{ContextID: "evil-1", Card: &wire.AgentCard{Name: "bystander"}})
	require.NoError(t, err)

	p := openPage(t, b, evilHost)
	var res struct{ Name, Message string }
	p.mustEval(`try {
  await bus.connectSession({contextId: "evil-1", credentials: creds, callTimeoutMs: 1500});
  return {name: "connected", message: ""};
} catch (err) {
  return {name: err.name, message: err.message};
}`, &res)
	require.Equal(t, "UnavailableError", res.Name, res.Message)
	require.Contains(t, res.Message, "no connection within")

	refused := b.refused.kept()
	require.NotEmpty(t, refused, "the broker logs the refusal")
	for _, line := range refused {
		require.Contains(t, line, p.origin)
	}
	issued := p.credentialsIssued("evil-1")
	require.NotEmpty(t, issued, "the page had credentials")
	require.Zero(t, subscribers(t, b, "evil-1"), "no connection of the session subscribed to its events")
	// The page's credential itself was good: a program (which sends no
	// Origin) connects with it, to the same listener, and what it
	// subscribes the broker counts.
	c := issued[len(issued)-1]
	nc, err := nats.Connect(c.WSURL, nats.UserInfo(c.User, c.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("evil-1")))
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.SubscribeSync(natsbus.EventsSubject("evil-1"))
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	require.True(t, poll(browserTimeout, 20*time.Millisecond, func() bool { return subscribers(t, b, "evil-1") > 0 }), "the broker counts the subscription")
}

// subscribers is how many subscriptions receive the session's events,
// as the broker counts them (a2a.admin.sessions); the session must be
// listed (it has an agent).
func subscribers(t *testing.T, b *pageBroker, session string) int {
	t.Helper()
	var sessions wire.AdminSessions
	require.NoError(t, b.hostCall(wire.MethodAdminSessions, struct{}{}, &sessions))
	for _, s := range sessions.Sessions {
		if s.ContextID == session {
			require.NotNil(t, s.Subscribers, "the broker counts subscribers")
			return *s.Subscribers
		}
	}
	t.Fatalf("the broker does not list session %s", session)
	return 0
}

// TestBrowserSessionCredentialHasASessionsRights: over WebSocket, from a
// page, a session credential has exactly the rights of a session's TCP
// connection (docs/PROTOCOL.md §2.2): its own rpc subject, events and
// inbox, and nothing of another session's or of the host's. The page
// uses nats-core itself, which tries what the runtime never would; a Go
// client over TCP with a credential of the same session tries the same,
// and both get the same answers.
func TestBrowserSessionCredentialHasASessionsRights(t *testing.T) {
	if _, err := natsCoreBundle(); err != nil {
		missing(t, "nats-core for the page: %v (npm --prefix clients/node ci installs esbuild)", err)
	}
	b := startPageBroker(t)
	p := openPage(t, b, "localhost")
	// Another session, live, whose subjects the page reaches for.
	_, err := b.runtime("other").Spawn(context.Background(), wire.AgentCard{Name: "other"})
	require.NoError(t, err)

	type outcome struct {
		Op      string `json:"op"`
		Subject string `json:"subject"`
		Allowed bool   `json:"allowed"`
	}
	ops := []outcome{
		{Op: "request", Subject: "a2a.rpc.mine"}, // its own calls: answered
		{Op: "subscribe", Subject: "a2a.session.mine.events"},
		{Op: "subscribe", Subject: "_INBOX.mine.x.>"},
		{Op: "publish", Subject: "a2a.rpc.other"},
		{Op: "publish", Subject: "a2a.host.rpc"},
		{Op: "publish", Subject: "a2a.session.other.events"},
		{Op: "subscribe", Subject: "a2a.session.other.events"},
		{Op: "subscribe", Subject: "a2a.session.*.events"},
		{Op: "subscribe", Subject: "_INBOX.other.>"},
		{Op: "subscribe", Subject: "a2a.rpc.other"},
		{Op: "subscribe", Subject: ">"},
	}
	want := map[string]bool{"request a2a.rpc.mine": true, "subscribe a2a.session.mine.events": true, "subscribe _INBOX.mine.x.>": true}
	opsJSON, err := json.Marshal(ops)
	require.NoError(t, err)

	// Each operation on a connection of its own, so that one refusal
	// cannot hide or cause another; refused means the server said so
	// (-ERR) before the PONG of the flush.
	var page []outcome
	p.mustEval(`const {wsconnect} = await nats();
const out = [];
for (const op of `+string(opsJSON)+`) {
  const c = await creds("mine");
  const nc = await wsconnect({servers: c.wsUrl, user: c.user, pass: c.password, inboxPrefix: "_INBOX.mine", reconnect: false});
  const errors = [];
  (async () => { for await (const s of nc.status()) if (s.type === "error") errors.push(String(s.error?.message ?? s.error)); })();
  let allowed;
  if (op.op === "request") {
    const body = JSON.stringify({jsonrpc: "2.0", id: 1, method: "a2a.events.replay", params: {contextId: "mine"}});
    try {
      const m = await nc.request(op.subject, body, {timeout: 5000});
      allowed = "result" in m.json();
    } catch { allowed = false; }
  } else if (op.op === "publish") {
    nc.publish(op.subject, "{}");
    await nc.flush();
    await nc.flush(); // the status of an -ERR read with the first PONG has been handed on
    allowed = !errors.some((e) => /permissions violation/i.test(e));
  } else {
    const sub = nc.subscribe(op.subject);
    await nc.flush();
    allowed = !sub.isClosed() && !errors.some((e) => /permissions violation/i.test(e));
  }
  out.push({op: op.op, subject: op.subject, allowed});
  await nc.close();
}
return out;`, &page)

	// The same, over TCP, from Go.
	var tcp []outcome
	for _, op := range ops {
		c, err := b.credentials("mine")
		require.NoError(t, err)
		nc, err := nats.Connect(c.URL, nats.UserInfo(c.User, c.Password), nats.CustomInboxPrefix(natsbus.SessionInbox("mine")),
			nats.NoReconnect(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		require.NoError(t, err)
		// The server's -ERR comes before the PONG of the flush, and is
		// the connection's last error once it is read.
		refused := func() bool { return errors.Is(nc.LastError(), nats.ErrPermissionViolation) }
		allowed := false
		switch op.Op {
		case "request":
			body, err := wire.EncodeRequest(1, wire.MethodReplay, wire.ReplayParams{ContextID: "mine"})
			require.NoError(t, err)
			if m, err := nc.Request(op.Subject, body, 5*time.Second); err == nil {
				_, err = wire.DecodeResult(m.Data)
				allowed = err == nil
			}
		case "publish":
			require.NoError(t, nc.Publish(op.Subject, []byte("{}")))
			require.NoError(t, nc.Flush())
			allowed = !refused()
		case "subscribe":
			_, err := nc.SubscribeSync(op.Subject)
			require.NoError(t, err)
			allowed = nc.Flush() == nil && !refused()
		}
		nc.Close()
		tcp = append(tcp, outcome{Op: op.Op, Subject: op.Subject, Allowed: allowed})
	}

	for i, op := range ops {
		key := op.Op + " " + op.Subject
		require.Equal(t, want[key], page[i].Allowed, "over WebSocket, from the page: %s", key)
		require.Equal(t, want[key], tcp[i].Allowed, "over TCP: %s", key)
	}
}
