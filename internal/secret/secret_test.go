package secret

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestHexIsLowercaseHexOfTheAskedLengthAndFresh(t *testing.T) {
	a, b := Hex(32), Hex(32)
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}$`), a)
	assert.NotEqual(t, a, b)
	assert.Len(t, Hex(16), 32)
}
