#!/bin/sh
# Test-only plugin: answers each request with the result the file named by
# $CANNED_ANSWERS gives for its method, one line per method: the name, a
# tab, the JSON result (`null` for a method it does not list). Reads the
# request's id and method from the start of the line, where the host
# writes them (`{"jsonrpc":"2.0","id":N,"method":"..."`); notifications
# (no id) get no answer. Exits at the end of its input. Shell builtins
# only: no process is started per request.
tab=$(printf '\t')
while IFS= read -r line; do
  rest=${line#'{"jsonrpc":"2.0","id":'}
  [ "$rest" != "$line" ] || continue
  id=${rest%%,*}
  rest=${rest#*,'"method":"'}
  method=${rest%%'"'*}
  result=null
  while IFS= read -r entry; do
    if [ "${entry%%"$tab"*}" = "$method" ]; then
      result=${entry#*"$tab"}
      break
    fi
  done < "$CANNED_ANSWERS"
  printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$id" "$result"
done
