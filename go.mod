module github.com/idem-go/idem

go 1.25.0

toolchain go1.26.8

require (
	github.com/dunglas/httpsfv v1.1.2
	github.com/gowebpki/jcs v1.0.2
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)
