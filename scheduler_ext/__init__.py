"""The kube-scheduler HTTP extender that places P/D and wide-EP groups whole
by topology. ``protocol``: the scheduler's requests and our answers, typed;
``state``: a cache fed by watches; ``placement``: the decisions, pure
functions over that cache; ``server``: the HTTP edge."""
