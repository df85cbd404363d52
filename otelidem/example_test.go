package otelidem_test

import (
	"log"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/otelidem"
	"github.com/idem-go/idem/store/memory"
)

func Example() {
	mp := sdkmetric.NewMeterProvider() // with the application's readers
	tp := sdktrace.NewTracerProvider() // with the application's exporters
	obs, err := otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	s := memory.New(memory.Config{})
	engine, err := idem.New(s, idem.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	// The services report under the same names as the engine.
	m, err := maintenance.New(s, maintenance.Config{Observer: obs})
	if err != nil {
		log.Fatal(err)
	}
	_, _ = engine, m
	// Output:
}
