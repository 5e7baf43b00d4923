//go:build windows

package connfile

import (
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/windows"
)

// TestTheConnectionFileIsTheUsersAlone: on Windows the folder and the file
// carry an ACL that grants the current user alone, not inherited from
// above (the twin of the Unix mode checks in connfile_test.go).
func TestTheConnectionFileIsTheUsersAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), ownFolderName, "connection.json")
	c, err := Lock(path)
	require.NoError(t, err)
	defer c.Release()
	require.NoError(t, c.Write(Info{URL: "nats://127.0.0.1:1", Token: "t", PID: 1}))
	me, err := currentUser()
	require.NoError(t, err)
	for _, p := range []string{filepath.Dir(path), path} {
		sd, err := windows.GetNamedSecurityInfo(p, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION)
		require.NoError(t, err, p)
		dacl, _, err := sd.DACL()
		require.NoError(t, err)
		require.NotNil(t, dacl)
		control, _, err := sd.Control()
		require.NoError(t, err)
		if p == filepath.Dir(path) {
			assert.NotZero(t, control&windows.SE_DACL_PROTECTED, "%s inherits no ACE from above", p)
		}
		for i := range uint32(dacl.AceCount) {
			var ace *windows.ACCESS_ALLOWED_ACE
			require.NoError(t, windows.GetAce(dacl, i, &ace))
			sid := (*windows.SID)(unsafe.Pointer(&ace.SidStart))
			assert.True(t, sid.Equals(me), "%s grants %s", p, sid)
		}
	}
}
