/* SPDX-License-Identifier: Apache-2.0 */
/* The text of a log line: printf formatting that keeps the line logfmt.
 *
 * The library's lines are `key=value` pairs written with printf formats, and
 * a value that comes from outside (a path, a URI, a peer's error text) may
 * hold a space, a quote or an `=` that would end the value early or start a
 * key. So a string argument in value position is written as logfmt wants
 * it: `key=%s` quoted when it needs quotes, `key=\"%s\"` with its quotes,
 * backslashes and line breaks escaped. A line that describes its event with
 * `msg="..."` and names none also gets the event key every line carries,
 * `event=`, made from the message's words, in front. (A line of free text,
 * no `key=` first, is left as written: its call site should say it as
 * pairs.) Pure: no I/O, no allocation. */
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

/* One conversion of a printf format: its text, and what it consumes. */
struct spec {
	const char *start; /* at '%' */
	size_t len;        /* through the conversion character */
	char conv;         /* 'd', 's', 'f' ... ('%' for "%%", 0 for one we do not take) */
	char length[3];    /* "", "h", "hh", "l", "ll", "z", "j", "t", "L" */
	int star_width, star_precision, precision;
};

static const char *parse_spec(const char *p, struct spec *s)
{
	memset(s, 0, sizeof(*s));
	s->start = p++;
	s->precision = -1;
	if (*p == '%') {
		s->conv = '%';
		s->len = 2;
		return p + 1;
	}
	while (*p && strchr("-+ #0'", *p))
		p++;
	if (*p == '*') {
		s->star_width = 1;
		p++;
	}
	while (isdigit((unsigned char)*p))
		p++;
	if (*p == '.') {
		p++;
		s->precision = 0;
		if (*p == '*') {
			s->star_precision = 1;
			p++;
		}
		while (isdigit((unsigned char)*p))
			s->precision = s->precision * 10 + (*p++ - '0');
	}
	size_t n = 0;
	while (*p && strchr("hlzjtL", *p) && n < 2)
		s->length[n++] = *p++;
	s->conv = *p && strchr("diouxXcspfFeEgGaA", *p) ? *p : 0;
	if (*p)
		p++;
	s->len = (size_t)(p - s->start);
	return p;
}

/* A string argument's place: after `=` (a bare value), between `="` and `"`
 * (a quoted one), or in free text. */
enum place { FREE, BARE, QUOTED };

static enum place place_of(const char *fmt, const struct spec *s)
{
	if (s->conv != 's' || s->precision >= 0 || s->star_precision || s->len != 2)
		return FREE;
	const char *at = s->start;
	if (at > fmt && at[-1] == '=')
		return BARE;
	if (at - fmt >= 2 && at[-1] == '"' && at[-2] == '=' && at[2] == '"')
		return QUOTED;
	return FREE;
}

static int bare_needs_quotes(const char *v)
{
	if (!*v)
		return 1;
	for (const unsigned char *c = (const unsigned char *)v; *c; c++)
		if (*c <= ' ' || *c == '"' || *c == '=' || *c == '\\' || *c == 0x7f)
			return 1;
	return 0;
}

static int quoted_needs_escapes(const char *v)
{
	return strpbrk(v, "\"\\\n\r\t") != NULL;
}

struct out {
	char *buf;
	size_t cap, len;
};

static void put(struct out *o, const char *s, size_t n)
{
	for (size_t i = 0; i < n && o->len + 1 < o->cap; i++)
		o->buf[o->len++] = s[i];
	if (o->cap)
		o->buf[o->len] = '\0';
}

static void put_escaped(struct out *o, const char *v)
{
	for (; *v; v++) {
		switch (*v) {
		case '"':
			put(o, "\\\"", 2);
			break;
		case '\\':
			put(o, "\\\\", 2);
			break;
		case '\n':
			put(o, "\\n", 2);
			break;
		case '\r':
			put(o, "\\r", 2);
			break;
		case '\t':
			put(o, "\\t", 2);
			break;
		default:
			put(o, v, 1);
		}
	}
}

/* Consume one conversion's arguments; *str receives a string argument.
 * Returns 0, or -1 for a conversion this walker does not know. */
static int skip_arg(const struct spec *s, va_list *ap, const char **str)
{
	if (s->star_width)
		(void)va_arg(*ap, int);
	if (s->star_precision)
		(void)va_arg(*ap, int);
	const char *l = s->length;
	switch (s->conv) {
	case '%':
		return 0;
	case 'd':
	case 'i':
	case 'o':
	case 'u':
	case 'x':
	case 'X':
		if (!strcmp(l, "ll"))
			(void)va_arg(*ap, long long);
		else if (!strcmp(l, "l"))
			(void)va_arg(*ap, long);
		else if (!strcmp(l, "z"))
			(void)va_arg(*ap, size_t);
		else if (!strcmp(l, "j"))
			(void)va_arg(*ap, intmax_t);
		else if (!strcmp(l, "t"))
			(void)va_arg(*ap, ptrdiff_t);
		else
			(void)va_arg(*ap, int);
		return 0;
	case 'c':
		(void)va_arg(*ap, int);
		return 0;
	case 's':
		*str = va_arg(*ap, const char *);
		return 0;
	case 'p':
		(void)va_arg(*ap, void *);
		return 0;
	case 'f':
	case 'F':
	case 'e':
	case 'E':
	case 'g':
	case 'G':
	case 'a':
	case 'A':
		if (!strcmp(l, "L"))
			(void)va_arg(*ap, long double);
		else
			(void)va_arg(*ap, double);
		return 0;
	default:
		return -1;
	}
}

/* Whether some string argument must be quoted or escaped (the rare case). */
static int needs_rewrite(const char *fmt, va_list ap0)
{
	va_list ap;
	va_copy(ap, ap0);
	int need = 0;
	for (const char *p = fmt; *p && !need;) {
		if (*p != '%') {
			p++;
			continue;
		}
		struct spec s;
		p = parse_spec(p, &s);
		const char *str = NULL;
		if (skip_arg(&s, &ap, &str) < 0)
			break; /* unknown: printed as printf prints it */
		enum place where = place_of(fmt, &s);
		if (str && where == BARE)
			need = bare_needs_quotes(str);
		else if (str && where == QUOTED)
			need = quoted_needs_escapes(str);
	}
	va_end(ap);
	return need;
}

/* One conversion as printf writes it, with its '*' width and precision. */
#define PIECE(T)                                                                              \
	do {                                                                                  \
		T v_ = va_arg(ap, T);                                                         \
		if (s.star_width && s.star_precision)                                         \
			snprintf(piece, sizeof(piece), one, width, precision, v_);            \
		else if (s.star_width || s.star_precision)                                    \
			snprintf(piece, sizeof(piece), one, s.star_width ? width : precision, v_); \
		else                                                                          \
			snprintf(piece, sizeof(piece), one, v_);                              \
	} while (0)

/* printf, one conversion at a time, writing string values as logfmt wants. */
static void rewrite(struct out *o, const char *fmt, va_list ap0)
{
	va_list ap;
	va_copy(ap, ap0);
	for (const char *p = fmt; *p;) {
		const char *lit = p;
		while (*p && *p != '%')
			p++;
		put(o, lit, (size_t)(p - lit));
		if (!*p)
			break;
		struct spec s;
		p = parse_spec(p, &s);
		if (s.conv == '%') {
			put(o, "%", 1);
			continue;
		}
		if (s.conv == 0 || s.len >= 32) {
			/* Not a conversion the library's formats use: the rest as written. */
			put(o, s.start, strlen(s.start));
			break;
		}
		int width = s.star_width ? va_arg(ap, int) : 0;
		int precision = s.star_precision ? va_arg(ap, int) : 0;
		char one[32], piece[512];
		snprintf(one, sizeof(one), "%.*s", (int)s.len, s.start);
		const char *l = s.length;
		enum place where = place_of(fmt, &s);
		switch (s.conv) {
		case 's':
			if (where != FREE) {
				const char *v = va_arg(ap, const char *);
				v = v ? v : "(null)";
				int quote = where == BARE && bare_needs_quotes(v);
				if (quote)
					put(o, "\"", 1);
				if (quote || where == QUOTED)
					put_escaped(o, v);
				else
					put(o, v, strlen(v));
				if (quote)
					put(o, "\"", 1);
				continue;
			}
			PIECE(const char *);
			break;
		case 'd':
		case 'i':
		case 'o':
		case 'u':
		case 'x':
		case 'X':
			if (!strcmp(l, "ll"))
				PIECE(long long);
			else if (!strcmp(l, "l"))
				PIECE(long);
			else if (!strcmp(l, "z"))
				PIECE(size_t);
			else if (!strcmp(l, "j"))
				PIECE(intmax_t);
			else if (!strcmp(l, "t"))
				PIECE(ptrdiff_t);
			else
				PIECE(int);
			break;
		case 'c':
			PIECE(int);
			break;
		case 'p':
			PIECE(void *);
			break;
		default:
			if (!strcmp(l, "L"))
				PIECE(long double);
			else
				PIECE(double);
		}
		put(o, piece, strlen(piece));
	}
	va_end(ap);
}

/* `event=` from words: up to the first conversion or punctuation, lower
 * case, joined by '_'; nothing when there are none. */
static void put_slug(struct out *o, const char *words)
{
	char slug[48];
	size_t n = 0;
	int gap = 0;
	for (const char *p = words; *p && !strchr("\"%;:(,.", *p) && n + 2 < sizeof(slug); p++) {
		if (isalnum((unsigned char)*p)) {
			if (gap && n)
				slug[n++] = '_';
			slug[n++] = (char)tolower((unsigned char)*p);
			gap = 0;
		} else {
			gap = 1;
		}
	}
	if (!n)
		return;
	put(o, "event=", 6);
	put(o, slug, n);
	put(o, " ", 1);
}

/* The words of the line's `msg="..."` when it names no `event=`, else NULL. */
static const char *described(const char *fmt)
{
	if (!strncmp(fmt, "event=", 6) || strstr(fmt, " event="))
		return NULL;
	const char *m = !strncmp(fmt, "msg=\"", 5) ? fmt : strstr(fmt, " msg=\"");
	return m ? m + (*m == ' ' ? 6 : 5) : NULL;
}

size_t gf_log_event_prefix(char *buf, size_t cap, const char *text)
{
	struct out o = { buf, cap, 0 };
	if (!cap)
		return 0;
	buf[0] = '\0';
	const char *words = described(text);
	if (words)
		put_slug(&o, words);
	return o.len;
}

void gf_log_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
{
	struct out o = { buf, cap, 0 };
	if (!cap)
		return;
	buf[0] = '\0';
	const char *words = described(fmt);
	if (words)
		put_slug(&o, words);
	if (needs_rewrite(fmt, ap)) {
		rewrite(&o, fmt, ap);
		return;
	}
	/* The common case: plain printf after the event key. */
	vsnprintf(buf + o.len, cap - o.len, fmt, ap);
}
