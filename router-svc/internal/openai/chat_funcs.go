package openai

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// The functions and filters Baton hands chat templates in place of the
// engine's own, where those differ from what Hugging Face's
// apply_chat_template gives a template (the models' templates were written
// against that).

// strftimeNow is the template function strftime_now(format): the time now
// (from clock) formatted as Python's strftime formats it. Llama 3.2's
// template puts "Today Date: 07 Mar 2026" in its system turn this way.
func strftimeNow(clock func() time.Time) jinja.Value {
	return jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string")
		}
		return jinja.NewString(strftime(clock(), args[0].AsString())), nil
	})
}

// strftime formats t by a Python (C locale) strftime format. Unknown
// directives are kept as written, as glibc does.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			b.WriteString(map[bool]string{true: "AM", false: "PM"}[t.Hour() < 12])
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
