package natsbus

// Redact is redact, for tests.
var Redact = redact
