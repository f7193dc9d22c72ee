//go:build race

package segment

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = true
