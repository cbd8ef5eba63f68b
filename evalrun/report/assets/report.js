// evalrun report: the episode table (search, filters, sorting, paging) and the transcript viewer.
// Plain JavaScript, no library: the page is one file and opens from disk with no network.
(function () {
  "use strict";

  function data(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") node.textContent = attrs[key];
      else if (key === "cls") node.className = attrs[key];
      else node.setAttribute(key, attrs[key]);
    });
    (children || []).forEach(function (child) { if (child) node.appendChild(child); });
    return node;
  }

  function shortText(value, limit) {
    var text = value == null ? "" : String(value).replace(/\n/g, " \u23ce ");
    return text.length > limit ? text.slice(0, limit) + "…" : text;
  }

  function scoreBadge(value) {
    if (value === undefined || value === null) return el("span", { cls: "muted", text: "—" });
    var cls = value >= 1 ? "pass" : value <= 0 ? "fail" : "mid";
    var text = Number.isInteger(value) ? String(value) : value.toFixed(3);
    return el("span", { cls: "score " + cls, text: text });
  }

  function listText(list) {
    return list && list.length ? list.join(", ") : "—";
  }

  // --- episode table ------------------------------------------------------------------------------

  function EpisodeTable(root) {
    this.root = root;
    var payload = data(root.getAttribute("data-source"));
    var fields = payload.fields;
    this.index = {};
    for (var i = 0; i < fields.length; i++) this.index[fields[i]] = i;
    this.rows = payload.rows;
    this.primary = payload.primary;
    this.total = payload.total;
    this.transcripts = root.getAttribute("data-transcripts");
    var ix = this.index;
    // lower-cased text each row is searched in: ids, item, prompt, output, target, answer, few-shot ids, head
    this.haystack = this.rows.map(function (r) {
      return [r[ix.episode_id], r[ix.item_id], r[ix.task], r[ix.prompt], r[ix.output], r[ix.target],
        r[ix.extracted], listText(r[ix.fewshot_ids]), r[ix.head], r[ix.finish_reason]].join("\u0001").toLowerCase();
    });
    this.search = root.querySelector("input[type=search]");
    this.taskSelect = root.querySelector("select.task");
    this.resultSelect = root.querySelector("select.result");
    this.seedSelect = root.querySelector("select.seed");
    this.sizeSelect = root.querySelector("select.size");
    this.body = root.querySelector("tbody");
    this.countNode = root.querySelector(".count");
    this.prevButton = root.querySelector("button.prev");
    this.nextButton = root.querySelector("button.next");
    this.pageNode = root.querySelector(".page");
    this.hasFewshot = this.rows.some(function (r) { return r[ix.fewshot_ids] && r[ix.fewshot_ids].length; });
    this.hasShuffle = this.rows.some(function (r) { return r[ix.shuffle_order] && r[ix.shuffle_order].length; });
    this.multiTask = new Set(this.rows.map(function (r) { return r[ix.task]; })).size > 1;
    this.page = 0;
    this.sortKey = null;
    this.sortDir = 1;
    this.fillSelects();
    this.buildHeader();
    var self = this;
    var refilter = function () { self.page = 0; self.apply(); };
    this.search.addEventListener("input", refilter);
    [this.taskSelect, this.resultSelect, this.seedSelect, this.sizeSelect].forEach(function (s) {
      if (s) s.addEventListener("change", refilter);
    });
    this.prevButton.addEventListener("click", function () { self.page -= 1; self.render(); });
    this.nextButton.addEventListener("click", function () { self.page += 1; self.render(); });
    this.apply();
  }

  EpisodeTable.prototype.fillSelects = function () {
    var ix = this.index;
    var tasks = Array.from(new Set(this.rows.map(function (r) { return r[ix.task]; }))).sort();
    var seeds = Array.from(new Set(this.rows.map(function (r) { return r[ix.seed]; }))).sort(function (a, b) {
      return a - b;
    });
    if (tasks.length > 1) {
      tasks.forEach(function (t) { this.taskSelect.appendChild(el("option", { value: t, text: "task " + t })); }, this);
    } else {
      this.taskSelect.hidden = true;
    }
    if (seeds.length > 1) {
      seeds.forEach(function (s) { this.seedSelect.appendChild(el("option", { value: String(s), text: "seed " + s })); },
        this);
    } else {
      this.seedSelect.hidden = true;
    }
  };

  EpisodeTable.prototype.columns = function () {
    var ix = this.index, primary = this.primary, cols = [];
    cols.push({ label: "#", cls: "num", value: function (r, n) { return n + 1; } });
    if (this.multiTask) cols.push({ label: "task", sort: ix.task, value: function (r) { return r[ix.task]; } });
    cols.push({ label: "item", sort: ix.item_id, value: function (r) { return r[ix.item_id]; } });
    cols.push({ label: "seed", cls: "num", sort: ix.seed, value: function (r) { return r[ix.seed]; } });
    cols.push({ label: "repeat", cls: "num", sort: ix.repeat, value: function (r) { return r[ix.repeat]; } });
    cols.push({ label: "prompt", cls: "text", value: function (r) { return shortText(r[ix.prompt], 160); } });
    cols.push({ label: "output", cls: "text", value: function (r) {
      return r[ix.output] ? shortText(r[ix.output], 160) : r[ix.finish_reason];
    } });
    cols.push({ label: "target", cls: "text", value: function (r) { return shortText(r[ix.target], 60); } });
    cols.push({ label: primary || "score", sort: "score", node: function (r) {
      return scoreBadge(primary ? r[ix.scores][primary] : null);
    } });
    if (this.hasFewshot) cols.push({ label: "few-shot", value: function (r) { return listText(r[ix.fewshot_ids]); } });
    if (this.hasShuffle) cols.push({ label: "shuffle", value: function (r) { return listText(r[ix.shuffle_order]); } });
    cols.push({ label: "head", cls: "mono", value: function (r) { return r[ix.head].slice(0, 12); } });
    return cols;
  };

  EpisodeTable.prototype.buildHeader = function () {
    var self = this;
    this.cols = this.columns();
    var row = this.root.querySelector("thead tr");
    this.cols.forEach(function (c) {
      var th = el("th", { cls: c.cls || "", text: c.label });
      if (c.sort !== undefined) {
        th.setAttribute("data-sort", "1");
        th.title = "sort";
        th.addEventListener("click", function () {
          self.sortDir = self.sortKey === c.sort ? -self.sortDir : 1;
          self.sortKey = c.sort;
          self.apply();
        });
      }
      row.appendChild(th);
    });
  };

  EpisodeTable.prototype.passes = function (r, want) {
    var ix = this.index;
    var failed = r[ix.finish_reason] === "failed" || r[ix.error];
    if (want === "failed") return Boolean(failed);
    var value = this.primary ? r[ix.scores][this.primary] : undefined;
    if (want === "pass") return value !== undefined && value >= 1;
    if (want === "notpass") return value === undefined || value < 1;
    return true;
  };

  EpisodeTable.prototype.apply = function () {
    var ix = this.index, self = this;
    var terms = this.search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    var task = this.taskSelect.hidden ? "" : this.taskSelect.value;
    var seed = this.seedSelect.hidden ? "" : this.seedSelect.value;
    var want = this.resultSelect.value;
    var matched = [];
    for (var n = 0; n < this.rows.length; n++) {
      var r = this.rows[n];
      if (task && r[ix.task] !== task) continue;
      if (seed && String(r[ix.seed]) !== seed) continue;
      if (want && !this.passes(r, want)) continue;
      var hay = this.haystack[n], all = true;
      for (var t = 0; t < terms.length; t++) {
        if (hay.indexOf(terms[t]) < 0) { all = false; break; }
      }
      if (all) matched.push(n);
    }
    if (this.sortKey !== null) {
      var key = this.sortKey, dir = this.sortDir, primary = this.primary;
      var get = key === "score"
        ? function (n) { var v = primary ? self.rows[n][ix.scores][primary] : undefined; return v === undefined ? -1 : v; }
        : function (n) { return self.rows[n][key]; };
      matched.sort(function (a, b) {
        var x = get(a), y = get(b);
        return (x < y ? -1 : x > y ? 1 : a - b) * dir;
      });
    }
    this.matched = matched;
    this.render();
  };

  EpisodeTable.prototype.render = function () {
    var size = parseInt(this.sizeSelect.value, 10);
    var pages = Math.max(1, Math.ceil(this.matched.length / size));
    this.page = Math.min(Math.max(this.page, 0), pages - 1);
    var start = this.page * size, stop = Math.min(start + size, this.matched.length);
    var body = this.body, self = this;
    while (body.firstChild) body.removeChild(body.firstChild);
    for (var k = start; k < stop; k++) {
      var n = this.matched[k], r = this.rows[n];
      var tr = el("tr", { cls: "ep", "data-row": String(n) });
      this.cols.forEach(function (c) {
        var td = el("td", { cls: c.cls || "" });
        if (c.node) td.appendChild(c.node(r));
        else td.textContent = c.value(r, n);
        tr.appendChild(td);
      });
      tr.addEventListener("click", this.toggle.bind(this, tr, n));
      body.appendChild(tr);
    }
    var shown = this.matched.length ? (start + 1) + "–" + stop : "0";
    var of = this.matched.length === this.rows.length
      ? this.rows.length.toLocaleString("en") + " episodes"
      : this.matched.length.toLocaleString("en") + " matching (" + this.rows.length.toLocaleString("en") + " in all)";
    var held = this.total > this.rows.length
      ? "; the table holds the first " + this.rows.length.toLocaleString("en") + " of " +
        this.total.toLocaleString("en") + " episodes"
      : "";
    this.countNode.textContent = "Showing " + shown + " of " + of + held;
    this.countNode.setAttribute("data-matched", String(this.matched.length));
    this.pageNode.textContent = "page " + (this.page + 1) + " of " + pages;
    this.prevButton.disabled = this.page === 0;
    this.nextButton.disabled = this.page >= pages - 1;
  };

  EpisodeTable.prototype.toggle = function (tr, n) {
    var next = tr.nextSibling;
    if (next && next.classList && next.classList.contains("detail")) {
      next.parentNode.removeChild(next);
      return;
    }
    var ix = this.index, r = this.rows[n];
    var grid = el("div", { cls: "detail-grid" });
    var add = function (label, value, pre) {
      grid.appendChild(el("div", { text: label }));
      var cell = el("div");
      if (pre) cell.appendChild(el("pre", { text: value }));
      else cell.textContent = value;
      grid.appendChild(cell);
    };
    add("episode", r[ix.episode_id], true);
    add("task / item", r[ix.task] + " / " + r[ix.item_id]);
    add("seed / repeat", r[ix.seed] + " / " + r[ix.repeat]);
    add("prompt", r[ix.prompt], true);
    add("output", r[ix.output] || "(none: " + r[ix.finish_reason] + ")", true);
    add("target", r[ix.target], true);
    var scores = r[ix.scores];
    add("scores", Object.keys(scores).sort().map(function (m) { return m + " " + scores[m]; }).join(", ") || "—");
    if (r[ix.extracted] != null) add("extracted answer", String(r[ix.extracted]), true);
    if (r[ix.error]) add("error", r[ix.error], true);
    add("finish reason / tokens", r[ix.finish_reason] + " / " + r[ix.output_tokens]);
    add("few-shot ids", listText(r[ix.fewshot_ids]));
    add("shuffle order", listText(r[ix.shuffle_order]));
    add("head", r[ix.head], true);
    if (this.transcripts) {
      var viewer = document.getElementById(this.transcripts);
      var cell = el("div");
      if (viewer && viewer.transcriptViewer && viewer.transcriptViewer.has(r[ix.episode_id])) {
        var button = el("button", { type: "button", text: "show transcript" });
        button.addEventListener("click", function (event) {
          event.stopPropagation();
          viewer.transcriptViewer.show(r[ix.episode_id]);
          viewer.scrollIntoView({ behavior: "smooth", block: "start" });
        });
        cell.appendChild(button);
      } else {
        cell.textContent = "not in this report (see --transcripts)";
      }
      grid.appendChild(el("div", { text: "transcript" }));
      grid.appendChild(cell);
    }
    var detail = el("tr", { cls: "detail" }, [el("td", { colspan: String(this.cols.length) }, [grid])]);
    tr.parentNode.insertBefore(detail, tr.nextSibling);
  };

  // --- transcripts --------------------------------------------------------------------------------

  function TranscriptViewer(root) {
    this.root = root;
    this.items = data(root.getAttribute("data-source")) || [];
    this.byId = {};
    this.select = root.querySelector("select");
    this.body = root.querySelector(".transcript");
    var self = this;
    this.items.forEach(function (t, n) {
      self.byId[t.episode_id] = n;
      var verdict = t.steps.filter(function (s) { return s.kind === "verdict"; })[0];
      var label = t.item_id + " · seed " + t.seed + " · repeat " + t.repeat + " · " + t.episode_id.slice(0, 10) +
        (verdict ? (verdict.status === "ok" ? " · passed" : " · not passed") : "");
      self.select.appendChild(el("option", { value: String(n), text: label }));
    });
    this.select.addEventListener("change", function () { self.render(parseInt(self.select.value, 10)); });
    root.transcriptViewer = this;
    if (this.items.length) this.render(0);
  }

  TranscriptViewer.prototype.has = function (episode) { return this.byId[episode] !== undefined; };

  TranscriptViewer.prototype.show = function (episode) {
    var n = this.byId[episode];
    if (n === undefined) return;
    this.select.value = String(n);
    this.render(n);
  };

  TranscriptViewer.prototype.render = function (n) {
    var t = this.items[n], body = this.body;
    while (body.firstChild) body.removeChild(body.firstChild);
    t.steps.forEach(function (s) {
      var cls = "step " + s.kind + (s.status === "error" ? " error" : "");
      var title = el("div", { cls: "title" }, [el("span", { cls: "kind", text: s.kind })]);
      title.appendChild(document.createTextNode(s.title));
      body.appendChild(el("div", { cls: cls }, [title, s.text ? el("pre", { text: s.text }) : null]));
    });
  };

  document.querySelectorAll(".transcripts[data-source]").forEach(function (root) { new TranscriptViewer(root); });
  document.querySelectorAll(".episodes[data-source]").forEach(function (root) { new EpisodeTable(root); });
})();
