//go:build !race

package regionsvc

const raceEnabled = false
