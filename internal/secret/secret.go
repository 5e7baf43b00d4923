// Package secret makes the random strings a2a-bus hands out: agent
// tokens, the epoch, NATS users and passwords.
package secret

import (
	"crypto/rand"
	"encoding/hex"
)

// Hex returns n random bytes as 2n lowercase hex digits. The protocol
// documents tokens and epochs as hex, which is why this is not
// rand.Text. crypto/rand.Read never fails (it crashes the program
// instead, as the standard library does when the OS has no randomness).
func Hex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
