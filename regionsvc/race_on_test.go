//go:build race

package regionsvc

// raceEnabled reports that the tests run under the race detector.
const raceEnabled = true
