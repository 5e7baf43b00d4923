package natsbus

import (
	"fmt"
	"maps"
	"slices"

	"github.com/a2a-bus/a2a-bus/wire"
)

// negatives returns an ErrBadConfig for each named setting below zero: a
// zero means the setting's default, and no setting is turned off by a
// sign.
func negatives(settings map[string]int64) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		if v := settings[name]; v < 0 {
			errs = append(errs, fmt.Errorf("%w: %s is %d; it must not be negative (0 means the default)", ErrBadConfig, name, v))
		}
	}
	return errs
}

// validMessageBytes checks a MaxMessageBytes setting: 0 (the default) or
// a message limit wire accepts.
func validMessageBytes(n int) error {
	if n <= 0 {
		return nil // 0: the default; negative: reported by negatives
	}
	if err := wire.NewLimits(n).Valid(); err != nil {
		return fmt.Errorf("%w: MaxMessageBytes: %v", ErrBadConfig, err)
	}
	return nil
}
