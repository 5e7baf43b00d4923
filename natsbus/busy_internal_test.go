package natsbus

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/a2a-bus/a2a-bus/natsbus/internal/admission"
	"github.com/a2a-bus/a2a-bus/wire"
)

// TestABusyAnswerNamesTheBound: A2A_BUSY says which bound the request
// met, with its figures, not the count bound whatever was hit.
func TestABusyAnswerNamesTheBound(t *testing.T) {
	for _, tc := range []struct {
		be   *admission.BusyError
		want string
	}{
		{&admission.BusyError{Waiting: 1024, WaitingBytes: 3000, Size: 10, Running: 8, MaxWait: 1024, MaxBytes: 1 << 23},
			"the session has 1024 requests waiting for the broker, the bound of requests waiting (8 in service); retry after a pause"},
		{&admission.BusyError{Bytes: true, Waiting: 64, WaitingBytes: 8 << 20, Size: 524288, Running: 8, MaxWait: 1024, MaxBytes: 1 << 23},
			"the session's 64 requests waiting for the broker hold 8388608 bytes; with this one's 524288 they would pass the bound of 8388608 bytes waiting (8 in service); retry after a pause"},
	} {
		var resp struct {
			ID    int         `json:"id"`
			Error *wire.Error `json:"error"`
		}
		require.NoError(t, json.Unmarshal(busyAnswer(json.RawMessage("7"), tc.be), &resp))
		assert.Equal(t, 7, resp.ID)
		require.NotNil(t, resp.Error)
		assert.ErrorIs(t, resp.Error, wire.ErrBusy)
		assert.Equal(t, tc.want, resp.Error.Message)
	}
}
