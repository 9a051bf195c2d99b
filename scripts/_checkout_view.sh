# Sourced by gpu_check.sh and gpu_pipeline.sh (after PY is set): where headway is not installed (a bare
# GPU machine), import it from this checkout through a package view in a temporary folder. headway/ is
# the package root and data/ heads/ inference/ train/ its subpackages (pyproject.toml's mapping).
if [ -n "${GPU_CHECK_FROM_CHECKOUT:-}" ] || ! "${PY[@]}" -c "import headway.inference" 2>/dev/null; then
  view=$(mktemp -d)
  trap 'rm -rf "$view"' EXIT
  mkdir "$view/headway"
  ln -s "$PWD"/headway/* "$view/headway/"
  for sub in data heads inference train; do ln -s "$PWD/$sub" "$view/headway/$sub"; done
  export PYTHONPATH="$view${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONSAFEPATH=1  # the checkout's own headway/ folder must not shadow the view
  echo "headway from this checkout ($PWD)"
fi
