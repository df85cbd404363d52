//go:build race

package main

// raceEnabled: the test binary was built with -race, so the idem binary
// under test is built with it too.
const raceEnabled = true
