package natsbus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// serverLogger routes the embedded server's logs to slog. Its Fatalf
// logs an error and returns: the stock logger's exits the process.
type serverLogger struct{ log *slog.Logger }

var _ server.Logger = serverLogger{}

func (l serverLogger) Noticef(format string, v ...any) { l.emit(slog.LevelDebug, format, v) }
func (l serverLogger) Warnf(format string, v ...any) {
	// The server's own WebSocket listener is on loopback behind the
	// gate (websocket.go): plain WebSocket there is by design.
	if strings.HasPrefix(format, "Websocket not configured with TLS") {
		l.emit(slog.LevelDebug, format, v)
		return
	}
	l.emit(slog.LevelWarn, format, v)
}
func (l serverLogger) Fatalf(format string, v ...any) { l.emit(slog.LevelError, format, v) }
func (l serverLogger) Errorf(format string, v ...any) { l.emit(slog.LevelError, format, v) }
func (l serverLogger) Debugf(format string, v ...any) { l.emit(slog.LevelDebug, format, v) }
func (l serverLogger) Tracef(format string, v ...any) { l.emit(slog.LevelDebug, format, v) }

func (l serverLogger) emit(level slog.Level, format string, v []any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "nats-server")
}
