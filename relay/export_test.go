package relay

// NextBatch exposes nextBatch to the external tests.
var NextBatch = nextBatch
