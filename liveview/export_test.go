package liveview

import "time"

// SetSnapshotFresh sets how long a snapshot serves the pages that ask,
// before a page asks (tests).
func SetSnapshotFresh(v *View, d time.Duration) { v.snap.fresh = d }

// SetSnapshotHooks sets the hooks a request calls when it comes and a
// read calls as it begins (tests).
func SetSnapshotHooks(v *View, came, read func()) { v.snap.came, v.snap.read = came, read }

// TookNotification counts a notification as the view does when it takes
// one (tests).
func TookNotification(v *View) { v.snap.changes.Add(1) }
