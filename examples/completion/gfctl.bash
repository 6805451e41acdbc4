# bash completion for gfctl (libgpufailover). Installed by meson into
# share/bash-completion/completions/gfctl, where bash-completion loads it on
# first use. Groups and commands are listed here (tests/man checks them
# against `gfctl --help`); each command's options are read from its own
# `--help`, so they follow the installed gfctl.
_gfctl_commands() {
	case "$1" in
	lock) echo "acquire status ping ready revoke evict switchover" ;;
	gms) echo "status ping wait-committed snapshot restore tiers demote" ;;
	gpu) echo "list" ;;
	supervise) echo "status" ;;
	esac
}

_gfctl() {
	local cur prev group cmd i
	cur="${COMP_WORDS[COMP_CWORD]}"
	prev="${COMP_WORDS[COMP_CWORD - 1]}"
	# After "--" come the words of the command `lock acquire` runs.
	for ((i = 1; i < COMP_CWORD; i++)); do
		if [ "${COMP_WORDS[i]}" = "--" ]; then
			COMPREPLY=($(compgen -c -- "$cur"))
			return
		fi
	done
	if [ "$COMP_CWORD" -eq 1 ]; then
		COMPREPLY=($(compgen -W "lock gms gpu supervise switchover --help --version" -- "$cur"))
		return
	fi
	group="${COMP_WORDS[1]}"
	if [ "$group" = switchover ]; then
		group=lock
		cmd=switchover
	elif [ "$COMP_CWORD" -eq 2 ]; then
		COMPREPLY=($(compgen -W "$(_gfctl_commands "$group") --help" -- "$cur"))
		return
	else
		cmd="${COMP_WORDS[2]}"
	fi
	case "$prev" in
	--secret-file | --dir)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	--backend)
		COMPREPLY=($(compgen -W "cuda host" -- "$cur"))
		return
		;;
	--to)
		COMPREPLY=($(compgen -W "warm cold" -- "$cur"))
		return
		;;
	--lock | --gms | --id | --timeout | --reconnect-timeout | --heartbeat | --fence | --epoch | --gpu | \
		--wake-bytes | --asleep-bytes | --model | --url)
		return
		;;
	esac
	if [[ "$cur" == -* ]]; then
		local opts
		opts="$("${COMP_WORDS[0]}" "$group" "$cmd" --help 2>/dev/null | grep -oE -- '--[a-z][a-z-]*' | sort -u)"
		COMPREPLY=($(compgen -W "$opts" -- "$cur"))
	fi
}
complete -F _gfctl gfctl
