package pipebus

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// lineReader splits a stream into lines of at most max bytes, without
// ever holding more than max bytes of one line: the rest of a longer line
// is skipped and the line reported as too long.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next line without its "\n" (or "\r\n"). A line longer
// than max is returned as nil with tooLong set. A last line without a
// newline is returned before io.EOF.
func (l *lineReader) next() (line []byte, tooLong bool, err error) {
	l.buf = l.buf[:0]
	for first := true; ; first = false {
		chunk, err := l.r.ReadSlice('\n')
		if first && err == nil {
			// The whole line is in the reader's buffer, as most are:
			// copy it once, not through buf.
			line = trimEOL(chunk)
			if len(line) > l.max {
				return nil, true, nil
			}
			return bytes.Clone(line), false, nil
		}
		if !tooLong {
			// Allow the line's own "\r\n" beyond max.
			if len(l.buf)+len(chunk) > l.max+2 {
				tooLong = true
				l.buf = l.buf[:0]
			} else {
				l.buf = append(l.buf, chunk...)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && (len(l.buf) > 0 || tooLong):
			// The last line, unterminated; EOF comes with the next call.
		default:
			return nil, false, err
		}
		if tooLong {
			return nil, true, nil
		}
		line = trimEOL(l.buf)
		if len(line) > l.max {
			return nil, true, nil
		}
		// The caller keeps the line: hand it its own copy.
		return bytes.Clone(line), false, nil
	}
}

// trimEOL cuts a line's "\n" or "\r\n".
func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// blank reports whether a line holds only whitespace. Blank lines are
// skipped: they carry no message.
func blank(line []byte) bool { return len(bytes.TrimSpace(line)) == 0 }
