package up

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Where the services' logs go (--log-dir): one file per service, so that
// their JSON lines do not interleave with the demo and the banner on the
// terminal, or batonctl's stderr as before.

// openLogDir returns the directory for the services' log files, creating
// it: flag itself, or a new baton-up-* directory in the OS temp directory
// when flag is empty. It returns "" for LogToStderr.
func openLogDir(flag string) (string, error) {
	switch flag {
	case LogToStderr:
		return "", nil
	case "":
		dir, err := os.MkdirTemp("", "baton-up-")
		if err != nil {
			return "", fmt.Errorf("--log-dir: %w", err)
		}
		return dir, nil
	}
	if err := os.MkdirAll(flag, 0o755); err != nil {
		return "", fmt.Errorf("--log-dir: %w", err)
	}
	return filepath.Abs(flag)
}

// logFileName is a service's log file: decode-svc#2 writes decode-svc-2.log.
func logFileName(service string) string {
	return strings.ReplaceAll(service, "#", "-") + ".log"
}

// logSink is where one service's output goes.
type logSink struct {
	w      io.Writer
	prefix string   // put before each line copied from the service's stderr
	path   string   // the log file; "" for stderr
	file   *os.File // closed by Close; nil for stderr
}

// newLogSink opens the log of the named service in dir, truncating an old
// one, or returns the stderr sink when dir is "".
func newLogSink(dir, service string, stderr io.Writer) (*logSink, error) {
	if dir == "" {
		return &logSink{w: stderr, prefix: "[" + service + "] "}, nil
	}
	path := filepath.Join(dir, logFileName(service))
	// O_APPEND: the service's stdout and the copy of its stderr share the file.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--log-dir: %w", err)
	}
	return &logSink{w: f, path: path, file: f}, nil
}

// Close closes the log file, if there is one.
func (s *logSink) Close() {
	if s.file != nil {
		s.file.Close()
	}
}
