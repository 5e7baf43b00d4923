package liveview

import "time"

// SetSnapshotFresh sets how long a snapshot serves the pages that ask,
// before a page asks (tests).
func SetSnapshotFresh(v *View, d time.Duration) { v.snap.fresh = d }
